"""Opening remote objects: one GET of the first bytes (size and ETag from its answer), no
HEAD, for s3 and http objects, when a stream's objects are found or when one is opened; the checks a HEAD gave stay (missing, a directory, a
0-byte object, an object changed or removed after it was opened). Against a real
keep-alive range server (tests/remote_helpers.py) and moto's S3 server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import chute
from chute import sources
from chute.records import RecordWriter
from remote_helpers import RangeServer, read_by_blocks, use_remote_env


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


def _shards(d: Path, n: int, lines: int) -> list[list[dict[str, int]]]:
    """`n` JSONL files `d/s{k}.jsonl` of `lines` objects each (file 1 empty); their rows."""
    d.mkdir(parents=True, exist_ok=True)
    rows = [[{"shard": k, "i": i} for i in range(lines if k != 1 else 0)] for k in range(n)]
    for k, shard in enumerate(rows):
        (d / f"s{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shard))
    return rows


@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_a_stream_opens_each_object_with_one_get_and_no_head(tmp_path: Path, scheme: str) -> None:
    if scheme == "http":
        pytest.importorskip("aiohttp", reason="fsspec's http file system needs aiohttp")
    rows = _shards(tmp_path / "served" / "b", 4, 30)  # each under one block; one empty
    with RangeServer(str(tmp_path / "served")) as server:
        if scheme == "s3":
            urls, options = [f"s3://b/s{k}.jsonl" for k in range(4)], _options(server.port)
        else:
            urls, options = [f"http://127.0.0.1:{server.port}/b/s{k}.jsonl" for k in range(4)], None
        ds = chute.experimental.JsonlIterDataset(urls, cycle_length=2, storage_options=options)
        # Found: the first block of each; the empty one answered 416, so a HEAD tells its size.
        assert server.gets == 4 and server.heads == 1
        got = list(ds)
        want = list(
            chute.experimental.InterleaveIterDataset(
                [chute.MapDataset.source(r) for r in rows], cycle_length=2
            )
        )
        assert got == want
        # Opened when found, with its first block: no more request for a (small) object.
        assert server.gets == 4
        assert server.heads == 1


def test_a_zero_byte_object_in_moto_reads_as_empty(s3_server: Any, tmp_path: Path) -> None:
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    fs = s3_server.fs()
    fs.pipe_file(f"{prefix}/empty.jsonl", b"")
    fs.pipe_file(f"{prefix}/one.jsonl", b'{"a": 1}\n')
    urls = [f"{prefix}/empty.jsonl", f"{prefix}/one.jsonl"]
    ds = chute.experimental.JsonlIterDataset(urls, storage_options=s3_server.options)
    assert list(ds) == [{"a": 1}]


def test_a_missing_object_is_named_when_the_stream_is_made(tmp_path: Path) -> None:
    _shards(tmp_path / "served" / "b", 2, 5)
    with RangeServer(str(tmp_path / "served")) as server:
        urls = ["s3://b/s0.jsonl", "s3://b/nope.jsonl", "s3://b/s1.jsonl"]
        with pytest.raises(chute.DataError, match=r"s3://b/nope\.jsonl.*no such"):
            chute.experimental.JsonlIterDataset(urls, storage_options=_options(server.port))


def test_a_directory_is_named_as_one(s3_server: Any) -> None:
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    s3_server.fs().pipe_file(f"{prefix}/dir/a.jsonl", b'{"a": 1}\n')
    ds = chute.experimental.JsonlIterDataset(f"{prefix}/dir", storage_options=s3_server.options)
    with pytest.raises(chute.DataError, match=rf"{prefix}/dir: it is a directory"):
        list(ds)


def _records(path: Path, n: int) -> list[bytes]:
    records = [bytes([i % 256]) * 700 for i in range(n)]
    with RecordWriter(path) as w:
        for r in records:
            w.write(r)
    return records


@pytest.mark.parametrize("change", ["longer", "removed"])
def test_an_object_changed_after_its_first_get_is_caught(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    monkeypatch.setenv("CHUTE_REMOTE_BLOCK_BYTES", "4096")
    read_by_blocks(monkeypatch, cache_bytes=8192)  # later reads go to the store
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "0")
    records = _records(tmp_path / "a.crec", 200)
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    fs = s3_server.fs()
    fs.put_file(str(tmp_path / "a.crec"), f"{prefix}/a.crec")
    src = sources.RecordFileDataSource(f"{prefix}/a.crec", storage_options=s3_server.options)
    assert src[0] == records[0]  # opened: its first block read, size and ETag known
    if change == "longer":
        fs.pipe_file(f"{prefix}/a.crec", (tmp_path / "a.crec").read_bytes() + b"more")
        match = rf"{prefix}/a\.crec: the object changed"
    else:
        fs.rm_file(f"{prefix}/a.crec")
        match = rf"{prefix}/a\.crec: the object was removed after chute opened it"
    with pytest.raises(chute.DataError, match=match):
        src.__getitems__(list(range(100, 200)))


def _big_jsonl(path: Path, n: int) -> list[dict[str, Any]]:
    rows = [{"i": i, "text": "x" * (i % 300)} for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_a_long_object_streams_in_windows_read_ahead(tmp_path: Path) -> None:
    rows = _big_jsonl(tmp_path / "served" / "b" / "big.jsonl", 16000)  # ~2.5 MB
    size = (tmp_path / "served" / "b" / "big.jsonl").stat().st_size
    with RangeServer(str(tmp_path / "served"), delay_s=0.005) as server:
        ds = chute.experimental.JsonlIterDataset(
            "s3://b/big.jsonl", storage_options=_options(server.port)
        )
        it = iter(ds)
        assert [next(it) for _ in range(5000)] == rows[:5000]
        state = it.get_state()
        assert list(it) == rows[5000:]
        # Found (its first MiB, with its size and ETag), then the rest in 1 MiB windows.
        windows = -(-(size - (1 << 20)) // (1 << 20))
        assert server.gets == 1 + windows and server.heads == 0
        it2 = iter(ds)
        it2.set_state(state)  # restored mid-object: read from there, ahead again
        assert list(it2) == rows[5000:]


def test_an_object_replaced_while_streamed_is_caught(s3_server: Any, tmp_path: Path) -> None:
    rows = _big_jsonl(tmp_path / "big.jsonl", 22000)  # ~3.5 MB: 4 windows
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    fs = s3_server.fs()
    fs.put_file(str(tmp_path / "big.jsonl"), f"{prefix}/big.jsonl")
    ds = chute.experimental.JsonlIterDataset(
        f"{prefix}/big.jsonl", storage_options=s3_server.options
    )
    it = iter(ds)
    assert [next(it) for _ in range(100)] == rows[:100]
    data = bytearray((tmp_path / "big.jsonl").read_bytes())
    data[-10:-1] = b"y" * 9  # same size, other bytes: a new ETag
    fs.pipe_file(f"{prefix}/big.jsonl", bytes(data))
    with pytest.raises(chute.DataError, match=rf"{prefix}/big\.jsonl: the object changed"):
        list(it)
