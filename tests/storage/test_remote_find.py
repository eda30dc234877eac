"""Building a stream over many objects finds them all in one round of GETs of their first
blocks; reading them then starts from those blocks, on the connections that found them:
requests and connections counted on a real keep-alive server (`RangeServer`); an object
replaced between building and reading is still a DataError naming it (moto)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import chute
from chute._src.storage.remote import file as remote_file
from remote_helpers import RangeServer, use_remote_env

SHARDS = 8


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
    use_remote_env(monkeypatch, tmp_path)


def _options(port: int) -> dict[str, Any]:
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
    }


def _shards(d: Path, lines_each: int) -> list[Path]:
    d.mkdir(parents=True)
    paths = [d / f"shard-{k}.jsonl" for k in range(SHARDS)]
    for k, p in enumerate(paths):
        p.write_text(
            "".join(json.dumps({"s": k, "i": i, "pad": "x" * 60}) + "\n" for i in range(lines_each))
        )
    return paths


@pytest.mark.parametrize(
    "lines_each,first_max,gets_to_read",
    [(100, None, 0), (1500, None, 0), (1500, 1, SHARDS)],
)
def test_objects_are_read_from_their_first_blocks_on_the_connections_that_found_them(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    lines_each: int,
    first_max: int | None,
    gets_to_read: int,
) -> None:
    """Shards of ~9 KiB and of ~140 KiB (inside what is read of each when found: 1 MiB
    each for these 8) cost one GET each, to build and read; when only their first block
    is read when found, the ~140 KiB ones cost one more each (the rest, read ahead), on
    the same connections."""
    if first_max is not None:
        monkeypatch.setattr(remote_file, "_FIRST_MAX", first_max)
    paths = _shards(tmp_path / "served" / "b", lines_each)
    local = list(
        chute.experimental.FileLinesIterDataset(
            [str(p) for p in paths], parse=bytes, cycle_length=4
        )
    )
    urls = [f"s3://b/{p.name}" for p in paths]
    with RangeServer(str(tmp_path / "served")) as server:
        ds = chute.experimental.FileLinesIterDataset(
            urls, parse=bytes, cycle_length=4, storage_options=_options(server.port)
        )
        assert (server.gets, server.heads, server.connections) == (SHARDS, 0, SHARDS)
        assert list(ds) == local
        assert (server.gets, server.heads) == (SHARDS + gets_to_read, 0)
        assert server.connections == SHARDS  # none opened to read


def test_an_object_replaced_between_building_and_reading_is_a_data_error(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the first block of each is read when found (read whole then, an object is
    # served as found, with no later read to meet the replacement: see the next test).
    monkeypatch.setattr(remote_file, "_FIRST_MAX", 1)
    paths = _shards(tmp_path / "local", 1500)  # ~140 KiB: more than its first block
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    fs = s3_server.fs()
    for p in paths:
        fs.put_file(str(p), f"{prefix}/{p.name}")
    urls = [f"{prefix}/{p.name}" for p in paths]
    ds = chute.experimental.JsonlIterDataset(
        urls, cycle_length=4, storage_options=s3_server.options
    )
    data = bytearray(paths[2].read_bytes())
    data[-20:-1] = b"y" * 19  # same size, other bytes: a new ETag
    fs.pipe_file(urls[2], bytes(data))
    with pytest.raises(chute.DataError, match=rf"{urls[2]}: the object changed"):
        list(ds)


def test_an_object_read_whole_when_found_is_served_as_found(s3_server: Any, tmp_path: Path) -> None:
    # Objects within what is read when found (~140 KiB each here, more than a block) are
    # read whole then: replaced afterwards, each is read as it was found, all its lines
    # of one and the same version, never a mix.
    paths = _shards(tmp_path / "local", 1500)
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    fs = s3_server.fs()
    for p in paths:
        fs.put_file(str(p), f"{prefix}/{p.name}")
    urls = [f"{prefix}/{p.name}" for p in paths]
    ds = chute.experimental.JsonlIterDataset(
        urls, cycle_length=4, storage_options=s3_server.options
    )
    local = list(chute.experimental.JsonlIterDataset([str(p) for p in paths], cycle_length=4))
    fs.pipe_file(urls[2], paths[2].read_bytes().replace(b'"pad"', b'"pod"'))
    assert list(ds) == local
