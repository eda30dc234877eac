"""InterleaveIterDataset: Grain's order, parallel reads, exact restore, any worker count."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.experimental import InterleaveIterDataset
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def _files(sizes: list[int]) -> list[chute.MapDataset[int]]:
    return [chute.MapDataset.range(100 * i, 100 * i + n) for i, n in enumerate(sizes)]


def test_order_is_grains() -> None:
    # grain 0.2.18's output for the same inputs.
    ds = InterleaveIterDataset(_files([3, 1, 0, 4, 2]), cycle_length=2)
    assert list(ds) == [0, 100, 1, 2, 300, 400, 301, 401, 302, 303]
    assert list(InterleaveIterDataset(_files([2, 2]), cycle_length=5)) == [0, 100, 1, 101]


@given(
    sizes=st.lists(st.integers(0, 7), min_size=1, max_size=8),
    cycle=st.integers(1, 5),
    chunk=st.integers(1, 4),
)
@settings(max_examples=25, deadline=None)
def test_every_element_once_and_restore_at_every_step(
    sizes: list[int], cycle: int, chunk: int
) -> None:
    inputs = [f.to_iter_dataset().filter(lambda x: x % 5 != 1) for f in _files(sizes)]
    ds = InterleaveIterDataset(inputs, cycle_length=cycle, iter_buffer_size=chunk)
    out = list(ds)
    assert sorted(out) == sorted(x for f in _files(sizes) for x in f if x % 5 != 1)
    for f in _files(sizes):
        mine = [x for x in out if x in set(f)]
        assert mine == sorted(mine)
    assert_equal_output_after_checkpoint(ds, max_elements=60)


class SlowFile:
    """A file whose every record read takes `latency` seconds (remote storage)."""

    def __init__(self, index: int, n: int, latency: float, threads: set[str]) -> None:
        self._index, self._n, self._latency, self._threads = index, n, latency, threads

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> int:
        self._threads.add(threading.current_thread().name)
        time.sleep(self._latency)
        return self._index * 1000 + i


def test_inputs_are_read_in_parallel_threads() -> None:
    threads: set[str] = set()
    no_threads = chute.ReadOptions(num_threads=0)
    files = [
        chute.MapDataset.source(SlowFile(i, 20, 0.002, threads)).to_iter_dataset(no_threads)
        for i in range(8)
    ]
    ds = InterleaveIterDataset(files, cycle_length=8, iter_buffer_size=4)
    out = list(ds)
    assert sorted(out) == sorted(i * 1000 + r for i in range(8) for r in range(20))
    assert len({t for t in threads if t.startswith("chute-interleave")}) >= 2


def test_errors_and_close() -> None:
    with pytest.raises(ValueError, match="cycle_length=0 is invalid"):
        InterleaveIterDataset(_files([1]), cycle_length=0)
    with pytest.raises(TypeError, match="datasets must be a list of IterDatasets or MapDatasets"):
        InterleaveIterDataset([[1, 2]], cycle_length=1)  # type: ignore[list-item]
    it = iter(InterleaveIterDataset(_files([5, 5]), cycle_length=2))
    it.start_prefetch()
    assert next(it) == 0
    it.close()
    it.close()
    with pytest.raises(RuntimeError, match="closed iterator"):
        list(it)


def _workers(n: int) -> chute.IterDataset[Any]:
    files = [chute.MapDataset.range(100 * i, 100 * i + 30).shuffle(seed=i) for i in range(6)]
    ds = InterleaveIterDataset(files, cycle_length=3, iter_buffer_size=4)
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=n))


def test_same_output_for_0_and_3_workers() -> None:
    assert_trees_equal(list(_workers(3)), list(_workers(0)))
    assert_equal_output_after_checkpoint(
        _workers(0), restore_into=_workers(3), max_elements=180, steps=[0, 1, 50, 97, 179, 180]
    )
