"""A pipeline may hold `multiprocessing` locks, conditions, events and semaphores of a
"spawn" or "forkserver" context: chute's workers open the same ones (by name), as a
process that `multiprocessing` starts does. Queues and pipes cannot be sent, nor the locks
of the default "fork" context."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import pytest

import chute


class _SetsEvent:
    def __init__(self, event: Any) -> None:
        self.event = event

    def __call__(self, x: int) -> int:
        self.event.set()
        return x


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_an_event_reaches_the_workers_and_getting_the_state_computes_nothing(
    method: str,
) -> None:
    event = mp.get_context(method).Event()
    ds = chute.MapDataset.source(list(range(50))).map(_SetsEvent(event)).to_iter_dataset()
    it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
    it.get_state()
    time.sleep(0.2)
    assert not event.is_set()  # nothing computed before the first element is asked for
    assert list(it) == list(range(50))
    assert event.is_set()
    it.close()


class _HoldsQueue:
    def __init__(self) -> None:
        self.queue: Any = mp.get_context("spawn").Queue()

    def __call__(self, x: int) -> int:
        return x


def test_a_queue_cannot_be_sent() -> None:
    ds = chute.MapDataset.range(4).map(_HoldsQueue()).to_iter_dataset()
    with pytest.raises(RuntimeError, match="Queue objects should only be shared"):
        list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1)))


class _HoldsLock:
    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def __call__(self, x: int) -> int:
        with self.lock:
            return x


def test_a_lock_of_the_fork_context_cannot_be_sent() -> None:
    ds = chute.MapDataset.range(4).map(_HoldsLock(mp.get_context("fork").Lock())).to_iter_dataset()
    with pytest.raises(RuntimeError, match="created in a fork context"):
        list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1)))
