"""Random reads of remote objects that fit in the block cache fetch each object whole,
once, like a local file in the page cache; objects that do not fit are read by blocks.
Threads reading at once fetch each block once. A real keep-alive range server on
127.0.0.1, counting the GETs and bytes it answers."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import sources
from chute._src.storage.remote import blocks
from chute._src.storage.remote import file as remote_file
from chute.records import RecordWriter
from remote_helpers import RangeServer, read_by_blocks, use_remote_env

SHARDS, PER = 4, 500  # 4 objects of 500 records of 1 KiB: ~2 MB in all


def _record(i: int) -> bytes:
    return i.to_bytes(4, "little") * 256


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
    use_remote_env(monkeypatch, tmp_path)
    # Only the first block of each object is read when found (as of a large one): what
    # these tests count is what a later read fetches.
    monkeypatch.setattr(remote_file, "_FIRST_MAX", 1)


def _served(tmp_path: Path) -> Path:
    d = tmp_path / "served" / "b"
    d.mkdir(parents=True)
    for s in range(SHARDS):
        with RecordWriter(d / f"part-{s}.crec") as w:
            for i in range(s * PER, (s + 1) * PER):
                w.write(_record(i))
    return tmp_path / "served"


def _source(server: RangeServer) -> Any:
    return sources.RecordFileDataSource(
        [f"s3://b/part-{s}.crec" for s in range(SHARDS)],
        storage_options={
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.port}"},
        },
    )


def _sizes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "b").iterdir())


def test_objects_that_fit_are_fetched_whole_once(tmp_path: Path) -> None:
    root = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = _source(server)
        assert len(src) == SHARDS * PER  # opened: found, then each one's index read
        opened = server.gets
        rng = np.random.default_rng(0)
        for _ in range(5):
            batch = [int(i) for i in rng.integers(0, SHARDS * PER, 256)]
            assert src.__getitems__(batch) == [_record(i) for i in batch]
        # Then one GET per object (each under 16 MiB: one request), for all the batches.
        assert server.gets - opened == SHARDS
        assert server.range_bytes <= _sizes(root) + 2 * SHARDS * blocks.block_bytes()
        every = list(range(SHARDS * PER))
        assert src.__getitems__(every) == [_record(i) for i in every]
        assert server.gets - opened == SHARDS  # all of it from the cache


def test_objects_that_do_not_fit_are_read_by_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_by_blocks(monkeypatch, cache_bytes=256 << 10)  # an eighth of the data
    root = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = _source(server)
        assert len(src) == SHARDS * PER  # opens every object
        assert not blocks.cache().holds_all()
        before_gets, before_bytes = server.gets, server.range_bytes
        batch = [3, 700, 1200, 1800]  # one record in each object
        assert src.__getitems__(batch) == [_record(i) for i in batch]
        # A block around each record, not the objects.
        assert 0 < server.gets - before_gets <= len(batch)  # some were read at opening
        assert server.range_bytes - before_bytes <= len(batch) * 2 * blocks.block_bytes()


def test_threads_reading_at_once_fetch_each_object_once(tmp_path: Path) -> None:
    root = _served(tmp_path)
    with RangeServer(str(root), delay_s=0.05) as server:  # a far store: reads overlap
        src = _source(server)
        assert len(src) == SHARDS * PER  # opened: found, then each one's index read
        opened = server.gets
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def read(seed: int) -> None:
            rng = np.random.default_rng(seed)
            batch = [int(i) for i in rng.integers(0, SHARDS * PER, 64)]
            start.wait()
            try:
                assert src.__getitems__(batch) == [_record(i) for i in batch]
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=read, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert server.gets - opened == SHARDS


def test_closing_a_source_lets_its_objects_go_from_the_count(tmp_path: Path) -> None:
    root = _served(tmp_path)
    with RangeServer(str(root)) as server:
        store, before = blocks.cache(), blocks.open_objects.nbytes
        src = _source(server)
        assert len(src) == SHARDS * PER  # opens every object
        assert blocks.open_objects.nbytes - before == _sizes(root)
        assert store.holds_all()
        ds = chute.MapDataset.source(src).shuffle(seed=1).to_iter_dataset().batch(100)
        assert sum(len(b) for b in ds) == SHARDS * PER
        src.close()
        assert blocks.open_objects.nbytes == before


def test_the_default_cache_is_a_share_of_the_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    from chute._src.core import process
    from chute._src.core.machine import available_memory

    monkeypatch.delenv("CHUTE_REMOTE_CACHE_BYTES", raising=False)
    monkeypatch.setattr(blocks, "_cache", None)
    want = max(128 << 20, available_memory() // 8)
    assert abs(blocks.cache().max_bytes - want) <= want // 10  # memory moves meanwhile
    monkeypatch.setattr(process, "_worker_count", 1)  # restored after the test
    process.set_worker_count(4)  # as the worker loop of a pool of 4 does
    assert blocks.default_cache_bytes() <= max(128 << 20, available_memory() // 32 + (64 << 20))


def test_objects_open_count_once_each_and_fit_or_not() -> None:
    # Objects other tests opened count too until their readers are collected (a reader in
    # a reference cycle waits for a full collection): 8 MiB of room beyond them.
    gc.collect()
    before = blocks.open_objects.nbytes
    c = blocks.BlockCache(max_bytes=int((before + (8 << 20)) / blocks.WHOLE_SHARE) + 1)
    room = int(c.max_bytes * blocks.WHOLE_SHARE) - before
    assert room >= 8 << 20
    blocks.open_objects.opened("x", room // 2)
    blocks.open_objects.opened("x", room // 2)  # a second reader of the same object
    try:
        assert blocks.open_objects.nbytes == before + room // 2 and c.holds_all()
        blocks.open_objects.opened("y", room)
        assert not c.holds_all()
        blocks.open_objects.closed("y")
        assert c.holds_all()
    finally:
        blocks.open_objects.closed("x")
        blocks.open_objects.closed("x")
    assert blocks.open_objects.nbytes == before


def test_an_object_larger_than_a_request_is_fetched_whole_in_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chute._src.storage.remote import reads

    monkeypatch.setattr(reads, "_MAX_RUN", 100_000)  # requests of 100 kB: 6 per object
    root = _served(tmp_path)
    with RangeServer(str(root)) as server:
        src = _source(server)
        assert len(src) == SHARDS * PER
        found = server.gets
        every = list(range(SHARDS * PER))
        assert src.__getitems__(every[::-7]) == [_record(i) for i in every[::-7]]
        parts = sum(-(-p.stat().st_size // 100_000) for p in (root / "b").iterdir())
        assert server.gets - found == parts
        assert src.__getitems__(every) == [_record(i) for i in every]
        assert server.gets - found == parts
