"""chute's range client under threads that fetch at once from one endpoint: connections
are shared through the endpoint's pool and none is lost; a refused connection leaves the
queued requests to the connections still open."""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import sources
from chute._src.remote import ranges
from chute.records import RecordWriter

sys.path.insert(0, str(Path(__file__).parent))
from remote_helpers import RangeServer, use_remote_env

SIZE = 1 << 20


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_remote_env(monkeypatch, tmp_path, block_cache=False)


def _blob(tmp_path: Path) -> tuple[Path, bytes]:
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "blob").write_bytes(data)
    return tmp_path, data


def _target(port: int) -> ranges.Target:
    url = f"http://127.0.0.1:{port}/b/blob"
    return ranges.Target(url, SIZE, "", lambda fresh: (url, time.monotonic()), None)


def _spans(n: int, seed: int) -> list[tuple[int, int]]:
    starts = np.random.default_rng(seed).integers(0, SIZE - 1024, n)
    return [(int(a), int(a) + 1024) for a in starts]


def test_threads_fetching_at_once_lose_no_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
    caplog.set_level(logging.WARNING, logger="chute")
    d = tmp_path / "served" / "b"
    d.mkdir(parents=True)
    records = [bytes([i % 251]) * 1024 for i in range(4000)]
    with RecordWriter(d / "r.crec") as w:
        for r in records:
            w.write(r)
    with RangeServer(str(tmp_path / "served"), delay_s=0.005) as server:
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.port}"}}
        src = sources.RecordFileDataSource("s3://b/r.crec", storage_options=options)
        assert src[0] == records[0]  # opened: the store's own client is done connecting
        before = server.connections
        (ep,) = [e for e in ranges._endpoints.values() if e.port == server.port]
        opened = ep.opened
        # 8 threads, each fetching chunks of random records at once over the shared pool.
        read = chute.ReadOptions(num_threads=8, prefetch_buffer_size=512)
        ds = chute.MapDataset.source(src).shuffle(seed=5).to_iter_dataset(read)
        order = chute.MapDataset.range(4000).shuffle(seed=5)
        assert list(ds) == [records[i] for i in order]
        new = server.connections - before
        assert new > 8  # the threads' fetches overlapped: each opened connections
        # Every connection the server accepted is alive in the pool: none was lost and
        # replaced, none refused (that would be a retry, logged).
        assert ep.opened - opened == new
        assert len(ep.idle) == ep.opened
        assert not [r.getMessage() for r in caplog.records]
        src.close()


def test_many_threads_share_the_pool_of_one_endpoint(tmp_path: Path) -> None:
    root, data = _blob(tmp_path)
    with RangeServer(str(root), delay_s=0.002) as server:
        t = _target(server.port)
        failures: list[Any] = []

        def work(seed: int) -> None:
            for k in range(10):
                spans = _spans(48, 100 * seed + k)
                got = ranges.fetch([(t, a, b) for a, b in spans])
                failures.extend((a, g) for (a, b), g in zip(spans, got) if g != data[a:b])

        threads = [threading.Thread(target=work, args=(s,)) for s in range(12)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not failures
        ep = t.endpoint
        assert server.connections == ep.opened == len(ep.idle)
        assert ep.opened <= 12 * 48


def test_refused_connection_leaves_the_queue_to_open_ones(tmp_path: Path) -> None:
    root, data = _blob(tmp_path)
    with RangeServer(str(root), delay_s=0.002) as server:
        t = _target(server.port)
        warm = _spans(4, 1)
        assert ranges.fetch([(t, a, b) for a, b in warm]) == [data[a:b] for a, b in warm]
        assert len(t.endpoint.idle) == 4
        server.stop_listening()  # the 4 pooled connections still work; new ones are refused
        spans = _spans(64, 2)
        got = ranges.fetch([(t, a, b) for a, b in spans])
        assert got == [data[a:b] for a, b in spans]
        assert server.connections == 4


def test_refused_with_no_connection_open_fails_every_request(tmp_path: Path) -> None:
    root, _ = _blob(tmp_path)
    with RangeServer(str(root)) as server:
        t = _target(server.port)
        server.stop_listening()
        got = ranges.fetch([(t, a, b) for a, b in _spans(16, 3)])
        assert all(isinstance(g, ConnectionRefusedError) for g in got), got
