"""ThreadPrefetchIterDataset: background prefetch with exact checkpoints."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import chute
from chute.experimental import ThreadPrefetchIterDataset
from chute.testing import assert_equal_output_after_checkpoint


def threads_named(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def wait_until(cond: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def pipeline(size: int = 3) -> ThreadPrefetchIterDataset[np.ndarray]:
    ds = (
        chute.MapDataset.range(60)
        .shuffle(seed=2)
        .to_iter_dataset()
        .filter(lambda x: x % 4)
        .batch(4)
    )
    return ThreadPrefetchIterDataset(ds, prefetch_buffer_size=size)


def test_same_output_and_exact_checkpoints() -> None:
    reference = [b.tolist() for b in pipeline(0)]
    assert [b.tolist() for b in pipeline(3)] == reference
    assert_equal_output_after_checkpoint(pipeline(3))
    assert_equal_output_after_checkpoint(pipeline(3), restore_into=pipeline(0))


def test_prefetch_overlaps_with_the_consumer() -> None:
    """While the consumer sleeps, the thread fills the buffer."""
    produced: list[int] = []

    def slow(x: int) -> int:
        produced.append(x)
        return x

    ds = ThreadPrefetchIterDataset(
        chute.MapDataset.range(100).map(slow).to_iter_dataset(chute.ReadOptions(num_threads=0)),
        prefetch_buffer_size=5,
    )
    it = iter(ds)
    it.start_prefetch()
    assert wait_until(lambda: len(produced) >= 5)  # before the first next()
    assert next(it) == 0
    it.close()


def test_errors_arrive_at_their_position() -> None:
    def bad(x: int) -> int:
        if x == 6:
            raise RuntimeError("bad element")
        return x

    ds = ThreadPrefetchIterDataset(
        chute.MapDataset.range(10).map(bad).to_iter_dataset(), prefetch_buffer_size=4
    )
    it = iter(ds)
    assert [next(it) for _ in range(6)] == [0, 1, 2, 3, 4, 5]
    with pytest.raises(RuntimeError, match="bad element"):
        next(it)


def test_close_and_gc_stop_the_thread() -> None:
    # Only this test's threads: an earlier test's iterator may still await collection.
    before = set(threads_named("chute-prefetch"))

    def ours() -> set[threading.Thread]:
        return set(threads_named("chute-prefetch")) - before

    it = iter(pipeline())
    next(it)
    assert ours()
    it.close()
    assert wait_until(lambda: not ours())
    it = iter(pipeline())
    next(it)
    assert ours()
    del it
    gc.collect()
    assert wait_until(lambda: not ours())


def test_bad_buffer_size() -> None:
    with pytest.raises(ValueError, match=r"prefetch_buffer_size=-1 is invalid"):
        ThreadPrefetchIterDataset(
            chute.MapDataset.range(3).to_iter_dataset(), prefetch_buffer_size=-1
        )
