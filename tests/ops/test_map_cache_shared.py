"""`MapDataset.cache()`: one cache for every iterator and epoch of a dataset, bounded,
and shared by worker processes through shared memory."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
import shm_helpers
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


class Counted:
    """A map that records each call in `calls` (in this process)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, x: int) -> np.ndarray:
        self.calls.append(x)
        return np.full(4, x, dtype=np.int64)


def test_every_epoch_and_iterator_reads_one_cache() -> None:
    fn = Counted()
    ds = chute.MapDataset.range(50).map(fn).cache()
    epochs = [[int(x[0]) for x in ds] for _ in range(3)]  # as a tf.data user writes it
    assert epochs == [list(range(50))] * 3 and len(fn.calls) == 50
    assert [int(b[0, 0]) for b in ds.batch(10)] == [0, 10, 20, 30, 40] and len(fn.calls) == 50
    assert int(ds[7][0]) == 7 and len(fn.calls) == 50
    it1, it2 = iter(ds), iter(ds.repeat(2))
    assert [int(next(it1)[0]) for _ in range(5)] == [int(x[0]) for x in list(it2)[50:55]]
    assert len(fn.calls) == 50
    assert ds.held == (50, 50 * ds[0].nbytes)


def test_a_block_that_spans_epochs_computes_each_position_once() -> None:
    """`cache().repeat(n)` read in one block reads each position n times: the cache
    computes it once, so what runs below the cache, and the counts `chute.stats` gives
    the stages there, do not depend on how the reader cut the stream into blocks (which
    depends on threads, workers and timing)."""
    fn = Counted()
    batch = chute.MapDataset.range(3).map(fn).cache().repeat(10).batch(30)[0]  # one block
    assert batch[:, 0].tolist() == [0, 1, 2] * 10
    assert sorted(fn.calls) == [0, 1, 2]


@pytest.mark.parametrize("workers", [0, 1])
def test_stages_below_a_cache_count_each_position_once(workers: int) -> None:
    """A window shuffle above `cache().repeat(2)` reads both epochs' positions in one
    block: the stages below the cache produce each element once, with or without workers."""
    from chute.experimental import WindowShuffleMapDataset

    ds = chute.MapDataset.source(list(range(12))).map(lambda x: x + 1).cache().repeat(2)
    ds = WindowShuffleMapDataset(ds, window_size=10, seed=2)
    options = chute.MultiprocessingOptions(num_workers=workers)
    chute.config.update("py_debug_mode", True)
    try:
        it = iter(ds.to_iter_dataset().mp_prefetch(options))
        try:
            assert len(list(it)) == 24
            counts = {s.name.split("(")[0]: s.elements for s in chute.stats(it).stages}
        finally:
            it.close()  # the workers, and with them the cache's shared store, go now
    finally:
        chute.config.update("py_debug_mode", False)
    del it, ds
    gc.collect()
    assert counts["SourceMapDataset"] == counts["MapMapDataset"] == 12
    assert counts["CacheMapDataset"] == 24


def test_bounded_by_elements_or_bytes_then_recomputed() -> None:
    fn = Counted()
    ds = chute.MapDataset.range(40).map(fn).cache(max_elements=15)
    for _ in range(3):
        assert [int(x[0]) for x in ds] == list(range(40))
    assert len(fn.calls) == 40 + 2 * 25 and ds.held[0] == 15
    fn2 = Counted()
    by_bytes = chute.MapDataset.range(40).map(fn2).cache(max_bytes=10 * 32)
    for _ in range(2):
        list(by_bytes)
    assert by_bytes.held == (10, 320) and len(fn2.calls) == 40 + 30
    none = chute.MapDataset.range(5).map(Counted()).cache(max_elements=0)
    assert [int(x[0]) for x in none] == list(range(5)) and none.held == (0, 0)
    with pytest.raises(ValueError, match=r"max_bytes=-1 is invalid: it must be an int >= 0"):
        chute.MapDataset.range(3).cache(max_bytes=-1)


def test_epochs_read_epoch_0_positions_whatever_is_cached() -> None:
    """As tf.data's cache: what is below it is computed for epoch 0's positions, so the
    output is the same with a full, a partial or an empty cache."""
    base = chute.MapDataset.range(30).random_map(
        lambda x, rng: x * 1000 + int(rng.integers(999)), seed=1
    )
    outs = []
    for bound in (None, 7, 0):
        ds = base.cache(max_elements=bound).repeat(3)
        outs.append(list(ds))
    assert outs[0] == outs[1] == outs[2]
    assert outs[0][:30] == outs[0][30:60] == [base[i] for i in range(30)]
    assert_equal_output_after_checkpoint(
        base.cache(max_elements=5).repeat(2).to_iter_dataset().batch(4)
    )


def test_arrays_are_handed_out_read_only_and_the_users_stay_writable() -> None:
    source = [np.zeros(3) for _ in range(4)]
    ds = chute.MapDataset.source(source).cache()
    x = ds[1]
    with pytest.raises(ValueError, match="read-only"):
        x += 1
    assert source[1].flags.writeable
    shifted = ds.map(lambda a: a + 1)  # a map making a new array is what works
    assert shifted[1].tolist() == [1.0, 1.0, 1.0]


class CountedInFile:
    """A map that appends a line per call to a file: counts calls in worker processes."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self, x: int) -> dict[str, Any]:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b"%d\n" % x)
        finally:
            os.close(fd)
        return {"x": np.full(8, x, dtype=np.int32), "label": x % 3}


def _cache_files() -> set[int]:
    """The cache stores this process holds (files in /dev/shm with no name)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return shm_helpers.held_shared_files(magic=shm_helpers.CACHE_MAGIC)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="shared memory: /dev/shm")
def test_worker_processes_share_the_cache_across_iterators(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    gc.collect()  # the stores of earlier tests' datasets go first
    before = _cache_files()
    ds = chute.MapDataset.range(300).map(CountedInFile(log)).cache()

    def epoch(workers: int, ds: chute.MapDataset[Any] = ds) -> chute.IterDataset[Any]:
        options = chute.MultiprocessingOptions(num_workers=workers)
        return ds.to_iter_dataset().batch(16).mp_prefetch(options)

    first = list(epoch(2))
    assert len(log.read_text().split()) == 300
    assert len(_cache_files() - before) == 1  # one store for the dataset
    assert_trees_equal(list(epoch(3)), first)  # other workers, a new iterator: all kept
    assert_trees_equal(list(epoch(0)), first)  # and this process reads it too
    assert_trees_equal(list(epoch(1)), first)
    assert sorted(map(int, log.read_text().split())) == list(range(300))
    assert ds.held[0] == 300
    assert_equal_output_after_checkpoint(epoch(2), restore_into=epoch(0), steps=[0, 3, 18])
    assert not shm_helpers.chute_names({os.getpid()})  # never a name in /dev/shm
    store = _cache_files() - before
    del ds, first, epoch
    gc.collect()
    assert _cache_files() == before  # let go with the dataset: the kernel frees it
    assert not store & shm_helpers.mapped_shared_files()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="shared memory: /dev/shm")
def test_shared_store_keeps_its_bound(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    ds = chute.MapDataset.range(100).map(CountedInFile(log)).cache(max_elements=40)
    options = chute.MultiprocessingOptions(num_workers=2)
    for _ in range(2):
        assert [
            int(b["x"][0, 0]) for b in ds.to_iter_dataset().batch(10).mp_prefetch(options)
        ] == list(range(0, 100, 10))
    assert ds.held[0] == 40
    assert len(log.read_text().split()) == 100 + 60
