"""Threads that read at once from one endpoint, through the store's shared connection
pool (obstore's), against the keep-alive `RangeServer`: every record right, nothing
logged, connections reused rather than opened per request."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest

import chute
from chute import sources
from chute.records import RecordWriter
from remote_helpers import RangeServer, use_remote_env


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_remote_env(monkeypatch, tmp_path, block_cache=False)


def _records(tmp_path: Path) -> list[bytes]:
    d = tmp_path / "served" / "b"
    d.mkdir(parents=True)
    records = [bytes([i % 251]) * 1024 for i in range(4000)]
    with RecordWriter(d / "r.crec") as w:
        for r in records:
            w.write(r)
    return records


def test_threads_reading_at_once_get_every_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="chute")
    records = _records(tmp_path)
    with RangeServer(str(tmp_path / "served"), delay_s=0.005) as server:
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.port}"}}
        src = sources.RecordFileDataSource("s3://b/r.crec", storage_options=options)
        assert src[0] == records[0]
        # 8 threads, each fetching chunks of random records at once over the shared pool.
        read = chute.ReadOptions(num_threads=8, prefetch_buffer_size=512)
        ds = chute.MapDataset.source(src).shuffle(seed=5).to_iter_dataset(read)
        order = chute.MapDataset.range(4000).shuffle(seed=5)
        assert list(ds) == [records[i] for i in order]
        assert not [r.getMessage() for r in caplog.records]
        # Connections are kept alive and reused: far fewer than requests.
        assert server.connections < server.gets / 4
        src.close()


def test_many_threads_calling_getitems_share_one_source(tmp_path: Path) -> None:
    records = _records(tmp_path)
    with RangeServer(str(tmp_path / "served"), delay_s=0.002) as server:
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.port}"}}
        src = sources.RecordFileDataSource("s3://b/r.crec", storage_options=options)
        failures: list[int] = []

        def work(seed: int) -> None:
            for k in range(5):
                idx = [int(i) for i in np.random.default_rng(seed * 10 + k).integers(0, 4000, 48)]
                got = src.__getitems__(idx)
                failures.extend(i for i, g in zip(idx, got) if g != records[i])

        threads = [threading.Thread(target=work, args=(s,)) for s in range(12)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not failures
