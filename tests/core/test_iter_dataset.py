"""IterDataset stages and to_iter_dataset: same output for any thread count, exact restore."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def test_iter_stages() -> None:
    ds = (
        chute.MapDataset.range(20)
        .to_iter_dataset()
        .map(lambda x: x + 1)
        .filter(lambda x: x % 2 == 0)
        .map_with_index(lambda i, x: i * 100 + x)
        .batch(3, drop_remainder=True)
    )
    assert [b.tolist() for b in ds] == [[2, 104, 206], [308, 410, 512], [614, 716, 818]]
    assert_equal_output_after_checkpoint(ds)


def test_iter_batch_keeps_partial_batch_unless_dropped() -> None:
    ds = chute.MapDataset.range(7).to_iter_dataset()
    assert [len(b) for b in ds.batch(3)] == [3, 3, 1]
    assert [len(b) for b in ds.batch(3, drop_remainder=True)] == [3, 3]
    assert list(ds.batch(3, batch_fn=tuple)) == [(0, 1, 2), (3, 4, 5), (6,)]


def test_threads_compute_in_parallel_and_in_order() -> None:
    seen: set[str] = set()

    def slow(x: int) -> int:
        seen.add(threading.current_thread().name)
        return x

    ds = chute.MapDataset.range(2000).map(slow)
    out = list(ds.to_iter_dataset(chute.ReadOptions(num_threads=4, prefetch_buffer_size=64)))
    assert out == list(range(2000))
    assert any(name.startswith("chute-read") for name in seen)


def test_num_threads_zero_runs_in_the_calling_thread() -> None:
    names: set[str] = set()

    def note_thread(x: int) -> int:
        names.add(threading.current_thread().name)
        return x

    ds = chute.MapDataset.range(50).map(note_thread)
    assert list(ds.to_iter_dataset(chute.ReadOptions(num_threads=0))) == list(range(50))
    assert names == {threading.current_thread().name}


# -- random pipelines: output and restore do not depend on the thread count -------------------

_MAP_STAGES: list[Callable[[chute.MapDataset[Any]], chute.MapDataset[Any]]] = [
    lambda ds: ds.map(lambda x: x * 3 + 1),
    lambda ds: ds.filter(lambda x: x % 4 != 1),
    lambda ds: ds.shuffle(seed=11),
    lambda ds: ds.repeat(2),
    lambda ds: ds[1::2],
    lambda ds: ds[3:],
    lambda ds: ds.random_map(lambda x, rng: x + int(rng.integers(0, 1000)), seed=5),
    lambda ds: ds.map_with_index(lambda i, x: x * 7 + i),
]
_ITER_STAGES: list[Callable[[chute.IterDataset[Any]], chute.IterDataset[Any]]] = [
    lambda ds: ds.map(lambda x: x - 2),
    lambda ds: ds.filter(lambda x: x % 3 != 0),
    lambda ds: ds.random_map(lambda x, rng: x * 10 + int(rng.integers(0, 10)), seed=6),
    lambda ds: ds.map_with_index(lambda i, x: x + i),
]


def _build(n: int, map_ops: list[int], iter_ops: list[int], batch: int, threads: int) -> Any:
    ds: chute.MapDataset[Any] = chute.MapDataset.range(n)
    for op in map_ops:
        ds = _MAP_STAGES[op](ds)
    options = chute.ReadOptions(num_threads=threads, prefetch_buffer_size=max(threads, 1) * 3)
    it = ds.to_iter_dataset(options)
    for op in iter_ops:
        it = _ITER_STAGES[op](it)
    return it.batch(batch) if batch else it


@given(
    n=st.integers(1, 60),
    map_ops=st.lists(st.integers(0, len(_MAP_STAGES) - 1), max_size=4),
    iter_ops=st.lists(st.integers(0, len(_ITER_STAGES) - 1), max_size=3),
    batch=st.integers(0, 4),
    threads=st.sampled_from([1, 2, 5]),
)
@settings(max_examples=40, deadline=None)
def test_random_pipelines_same_output_and_restore_for_any_threads(
    n: int, map_ops: list[int], iter_ops: list[int], batch: int, threads: int
) -> None:
    reference = list(_build(n, map_ops, iter_ops, batch, 0))
    threaded = _build(n, map_ops, iter_ops, batch, threads)
    assert_trees_equal(list(threaded), reference)
    assert_equal_output_after_checkpoint(
        _build(n, map_ops, iter_ops, batch, 0), restore_into=threaded, max_elements=40
    )


def test_start_prefetch_and_context_manager() -> None:
    ds = (
        chute.MapDataset.range(100)
        .map(np.sqrt)
        .to_iter_dataset(chute.ReadOptions(num_threads=2, prefetch_buffer_size=10))
    )
    with iter(ds) as it:
        it.start_prefetch()
        it.start_prefetch()  # idempotent
        assert next(it) == 0.0
    before = _reader_threads()
    it = iter(ds)
    next(it)
    it.close()
    it.close()
    assert _reader_threads_gone(before)


def _reader_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("chute-read")}


def _reader_threads_gone(before: set[threading.Thread], timeout: float = 10.0) -> bool:
    """True once no reader thread started after `before` was taken is alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _reader_threads() - before:
            return True
        time.sleep(0.01)
    return False


def test_garbage_collected_iterator_stops_its_threads() -> None:
    ds = chute.MapDataset.range(10_000).to_iter_dataset(chute.ReadOptions(num_threads=3))
    before = _reader_threads()
    it = iter(ds)
    next(it)
    del it
    gc.collect()
    assert _reader_threads_gone(before)


def test_exhausted_iterator_frees_its_threads_at_once() -> None:
    ds = chute.MapDataset.range(500).to_iter_dataset(chute.ReadOptions(num_threads=3))
    before = _reader_threads()
    it = iter(ds)
    assert len(list(it)) == 500
    assert _reader_threads_gone(before)  # `it` is still referenced here
    assert it.get_state()["next_index"] == 500


def test_iterating_an_unfinished_pipeline_twice_gives_the_same() -> None:
    ds = chute.MapDataset.range(10).shuffle(seed=0).to_iter_dataset()
    a, b = iter(ds), iter(ds)
    assert [next(a) for _ in range(3)] == [next(b) for _ in range(3)]


def test_threads_compute_ahead_at_most_256_mib_of_arrays() -> None:
    """500 elements ahead (the default buffer) of 32 MiB batches would be 16 GB."""
    made: list[int] = []

    def big_batch(i: int) -> np.ndarray:
        made.append(i)
        return np.zeros(32 << 18, dtype=np.float32)  # 32 MiB, pages never touched

    ds = (
        chute.MapDataset.range(2000)
        .map(big_batch)
        .to_iter_dataset(chute.ReadOptions(num_threads=4))
    )
    it = iter(ds)
    next(it)
    time.sleep(1.0)  # let the threads run as far ahead as they may
    assert len(made) <= 256 // 32 + 2 * 4 + 1, len(made)
    assert [int(next(it).size) for _ in range(3)] == [32 << 18] * 3
    it.close()
