"""`ComputePool`: the compute-ahead threads of the reader and of interleave."""

from __future__ import annotations

import gc
import threading
from concurrent.futures import Future

import pytest

from chute._src.exec.threadpool import ComputePool


def _blocked(pool: ComputePool) -> tuple[threading.Event, Future[bool], Future[str]]:
    """A pool of one thread kept busy until the event is set, with one piece of work
    queued behind it."""
    gate = threading.Event()
    running = pool.submit(gate.wait, 30)
    queued = pool.submit(lambda: "queued")
    return gate, running, queued


def test_starts_threads_at_the_first_submit_named_after_the_pool() -> None:
    pool = ComputePool(2, "chute-test-pool")
    assert not pool.started
    name = pool.submit(lambda: threading.current_thread().name).result(timeout=30)
    assert pool.started and name.startswith("chute-test-pool")
    pool.release()
    assert not pool.started


def test_release_cancels_work_not_started_and_the_pool_works_after() -> None:
    pool = ComputePool(1, "chute-test-pool")
    gate, running, queued = _blocked(pool)
    pool.release()
    assert queued.cancelled()
    gate.set()
    assert running.result(timeout=30) is True
    assert pool.submit(lambda: 2).result(timeout=30) == 2


def test_resize_leaves_earlier_work_to_the_old_threads() -> None:
    pool = ComputePool(1, "chute-test-pool")
    gate, running, queued = _blocked(pool)
    pool.resize(2)
    assert not running.done()
    assert pool.threads == 2
    # The new threads take new work at once, not after the old thread's.
    assert pool.submit(lambda: 3).result(timeout=30) == 3
    assert not queued.done()
    gate.set()
    assert queued.result(timeout=30) == "queued"
    pool.release()


def test_dropping_the_pool_cancels_work_not_started() -> None:
    pool = ComputePool(1, "chute-test-pool")
    gate, running, queued = _blocked(pool)
    del pool
    gc.collect()
    assert queued.cancelled()
    gate.set()
    assert running.result(timeout=30) is True


@pytest.mark.parametrize("threads", [0, -1])
def test_needs_a_thread(threads: int) -> None:
    with pytest.raises(ValueError, match=rf"threads={threads} must be at least 1"):
        ComputePool(threads, "chute-test-pool")
    with pytest.raises(ValueError, match=rf"threads={threads} must be at least 1"):
        ComputePool(1, "chute-test-pool").resize(threads)
