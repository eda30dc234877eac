"""Range reads through obstore against real servers on 127.0.0.1: moto's S3 (which closes
the connection after every answer) and the keep-alive `RangeServer` (which can answer
503 or refuse); records equal local reads, failures are DataErrors naming the URL, and
nothing is left open."""

from __future__ import annotations

import gc
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import sources
from chute.records import RecordWriter
from remote_helpers import RangeServer, use_remote_env

RECORDS = [bytes([i % 251]) * (100 + i % 900) for i in range(600)]
rng = np.random.default_rng(0)
INDICES = [int(i) for i in rng.integers(0, len(RECORDS), 200)]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
    use_remote_env(monkeypatch, tmp_path, block_cache=False)


# A file of 2 MB: FIRST and SECOND each read records from blocks nobody read before, so
# they reach the server whatever the block cache holds.
FIRST, SECOND = range(0, 1000, 40), range(1000, 2000, 40)


def _big(i: int) -> bytes:
    return bytes([i % 256]) * 1024


def _write(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    with RecordWriter(d / "big.crec") as w:
        for i in range(2000):
            w.write(_big(i))
    with RecordWriter(d / "a.crec") as w:
        for r in RECORDS:
            w.write(r)
    from array_record.python import array_record_module

    aw = array_record_module.ArrayRecordWriter(str(d / "a.array_record"), "group_size:1")
    for r in RECORDS:
        aw.write(r)
    aw.close()


def _options(port: int) -> dict[str, Any]:
    # Credentials in the options: worker processes (a fork server started earlier in the
    # session) do not see this test's environment.
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
    }


def _served(tmp_path: Path) -> tuple[Path, str]:
    """A directory the RangeServer serves, with the files under bucket `b`."""
    _write(tmp_path / "served" / "b")
    return tmp_path / "served", "s3://b"


@pytest.mark.parametrize(
    "cls,name",
    [(sources.RecordFileDataSource, "a.crec"), (sources.ArrayRecordDataSource, "a.array_record")],
)
def test_keep_alive_server_reads_equal_local(tmp_path: Path, cls: Any, name: str) -> None:
    root, prefix = _served(tmp_path)
    local = cls(str(root / "b" / name))
    with RangeServer(str(root)) as server:
        remote = cls(f"{prefix}/{name}", storage_options=_options(server.port))
        assert remote.__getitems__(INDICES) == local.__getitems__(INDICES)
        ds = chute.MapDataset.source(remote).shuffle(seed=3).to_iter_dataset().batch(64)
        want = chute.MapDataset.source(local).shuffle(seed=3).to_iter_dataset().batch(64)
        assert [list(b) for b in ds] == [list(b) for b in want]


def test_connections_are_kept_and_reused(tmp_path: Path) -> None:
    root, prefix = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = sources.RecordFileDataSource(
            f"{prefix}/big.crec", storage_options=_options(server.port)
        )
        # One record at a time, each from a block of its own: one request each.
        assert [src[i] for i in range(0, 2000, 40)] == [_big(i) for i in range(0, 2000, 40)]
        assert server.gets >= 50 and server.connections <= 5


@pytest.mark.parametrize(
    "cls,name",
    [(sources.RecordFileDataSource, "a.crec"), (sources.ArrayRecordDataSource, "a.array_record")],
)
def test_moto_closing_every_connection_reads_equal_local(
    s3_server: Any, tmp_path: Path, cls: Any, name: str
) -> None:
    _write(tmp_path)
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    s3_server.fs().put_file(str(tmp_path / name), f"{prefix}/{name}")
    remote = cls(f"{prefix}/{name}", storage_options=s3_server.options)
    local = cls(str(tmp_path / name))
    assert remote.__getitems__(INDICES[:60]) == local.__getitems__(INDICES[:60])


def test_refusal_with_a_fresh_url_names_the_url(tmp_path: Path) -> None:
    root, prefix = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = sources.RecordFileDataSource(
            f"{prefix}/big.crec", storage_options=_options(server.port)
        )
        server.deny = True
        with pytest.raises(chute.DataError, match=r"s3://b/big\.crec: access denied.*credentials"):
            src.__getitems__(FIRST)


def test_server_errors_are_retried(tmp_path: Path) -> None:
    root, prefix = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = sources.RecordFileDataSource(
            f"{prefix}/big.crec", storage_options=_options(server.port)
        )
        server.fail_remaining = 3
        assert src.__getitems__(FIRST) == [_big(i) for i in FIRST]
        assert server.fail_remaining == 0


def test_server_errors_past_the_retries_name_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "1")
    root, prefix = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = sources.RecordFileDataSource(
            f"{prefix}/big.crec", storage_options=_options(server.port)
        )
        server.fail_remaining = 10**6
        with pytest.raises(
            chute.DataError, match=r"s3://b/big\.crec.*max_retries: 1.*503.*SlowDown"
        ):
            src.__getitems__(FIRST)


def test_object_replaced_between_open_and_read(s3_server: Any, tmp_path: Path) -> None:
    _write(tmp_path)
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    fs = s3_server.fs()
    fs.put_file(str(tmp_path / "big.crec"), f"{prefix}/big.crec")
    src = sources.RecordFileDataSource(f"{prefix}/big.crec", storage_options=s3_server.options)
    assert src[3] == _big(3)  # opened (sources open on first use) and read
    data = bytearray((tmp_path / "big.crec").read_bytes())
    data[3000:3010] = b"x" * 10  # same size, other bytes: a new ETag
    fs.pipe_file(f"{prefix}/big.crec", bytes(data))
    with pytest.raises(chute.DataError, match=rf"{prefix}/big\.crec: the object changed"):
        src.__getitems__(FIRST)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds in /proc")
def test_sources_opened_and_closed_leave_nothing_behind(tmp_path: Path) -> None:
    root, prefix = _served(tmp_path)
    with RangeServer(str(root)) as server:

        def once() -> None:
            src = sources.RecordFileDataSource(
                f"{prefix}/big.crec", storage_options=_options(server.port)
            )
            assert src.__getitems__(INDICES) == [_big(i) for i in INDICES]
            src.close()

        once()  # the client's runtime, its event loop thread and pooled connections
        gc.collect()
        threads, fds = {t.name for t in threading.enumerate()}, _fds()
        for _ in range(10):
            once()
        gc.collect()
        # The store's pool is reused, not grown per source (a few more connections may
        # open when reads overlap more), and no thread is left per source (the remote
        # pool's threads are shared and bounded).
        assert {t.name for t in threading.enumerate()} <= threads | {"chute-remote"}
        assert _fds() <= fds + 8


def test_server_gone_after_open_names_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "1")
    root, prefix = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = sources.RecordFileDataSource(
            f"{prefix}/big.crec", storage_options=_options(server.port)
        )
        assert src[3] == _big(3)
    # Closed: the pooled connections are dead and new ones are refused.
    with pytest.raises(chute.DataError, match=r"s3://b/big\.crec.*max_retries: 1"):
        src.__getitems__(FIRST)


def test_worker_processes_read_with_their_own_connections(tmp_path: Path) -> None:
    root, prefix = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = sources.RecordFileDataSource(
            f"{prefix}/big.crec", storage_options=_options(server.port)
        )
        assert src.__getitems__(list(FIRST)) == [_big(i) for i in FIRST]  # pooled here
        ds = (
            chute.MapDataset.source(src)
            .to_iter_dataset()
            .mp_prefetch(chute.multiprocessing.MultiprocessingOptions(num_workers=2))
        )
        assert list(ds) == [_big(i) for i in range(2000)]
        assert src.__getitems__(list(SECOND)) == [_big(i) for i in SECOND]  # still usable


def test_http_urls_read_through_the_same_client(tmp_path: Path) -> None:
    pytest.importorskip("aiohttp", reason="fsspec's http file system needs aiohttp")
    root, _ = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = sources.RecordFileDataSource(f"http://127.0.0.1:{server.port}/b/big.crec")
        gets = server.gets
        assert src.__getitems__(list(FIRST)) == [_big(i) for i in FIRST]
        assert server.gets > gets
