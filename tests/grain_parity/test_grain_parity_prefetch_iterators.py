"""Prefetching as Grain's: a plain stateful iterator under `ThreadPrefetchDatasetIterator`,
and a reader that keeps computing ahead while the consumer holds its first element."""

from __future__ import annotations

import threading
import time
from typing import Any

import chute


class _Counter:
    """1, 2, ..., 10 with `get_state`/`set_state`: not a DatasetIterator."""

    def __init__(self) -> None:
        self.n = 0

    def __iter__(self) -> _Counter:
        return self

    def __next__(self) -> int:
        self.n += 1
        if self.n > 10:
            raise StopIteration
        return self.n

    def get_state(self) -> dict[str, int]:
        return {"n": self.n}

    def set_state(self, state: dict[str, int]) -> None:
        self.n = state["n"]


def test_a_plain_stateful_iterator_is_prefetched_and_restored() -> None:
    it = chute.experimental.ThreadPrefetchDatasetIterator(_Counter(), prefetch_buffer_size=4)
    head = [next(it) for _ in range(5)]
    state = it.get_state()
    assert state == {"n": 5}  # its own state, of its own shape
    assert head + list(it) == list(range(1, 11))
    it.set_state(state)
    assert list(it) == list(range(6, 11))


def test_a_plain_iterator_without_state_is_refused() -> None:
    try:
        chute.experimental.ThreadPrefetchDatasetIterator(iter([1, 2]), prefetch_buffer_size=2)
    except TypeError as e:
        assert "lacks ['get_state', 'set_state']" in str(e)
    else:
        raise AssertionError("no TypeError")


class _Slow:
    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.02)
        with self.lock:
            self.count += 1
        return i


def test_the_reader_computes_ahead_while_the_consumer_holds_the_first_element() -> None:
    source = _Slow()
    ds = chute.MapDataset.source(source).to_iter_dataset(chute.ReadOptions(num_threads=2))
    it = iter(ds)
    assert next(it) == 0
    deadline = time.monotonic() + 30
    while source.count < 16 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert source.count == 16  # all of it, without another call (before: 2)
    assert list(it) == list(range(1, 16))


def test_without_prefetching_the_first_element_is_computed_alone() -> None:
    """Grain computes one element per call with prefetch_buffer_size=0: chute computes
    blocks, but the first holds one element, so an iterator dropped after a few elements
    of a slow stage has not computed a block of them (Grain's test_no_mem_leak)."""
    made: list[int] = []

    def slow(x: int) -> int:
        made.append(x)
        time.sleep(0.02)
        return x

    ds = chute.MapDataset.range(100).map(slow)
    it = iter(ds.to_iter_dataset(chute.ReadOptions(prefetch_buffer_size=0)))
    assert next(it) == 0 and made == [0]
    assert next(it) == 1 and len(made) == 2  # slow: the next block is one element too
    seen: list[int] = []

    def note(x: int) -> int:
        seen.append(x)
        return x

    cheap = chute.MapDataset.range(1000).map(note)
    fast = iter(cheap.to_iter_dataset(chute.ReadOptions(num_threads=0)))
    assert [next(fast) for _ in range(20)] == list(range(20))
    assert len(seen) > 20  # fast elements: the blocks after the first are larger
