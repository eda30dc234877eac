"""The counts of the stages under a `to_iter_dataset` reader, credited as the reader hands
their elements out.

A reader computes blocks of its MapDataset ahead of the consumer: growing blocks in this
process, chunks on threads or in worker processes, how far ahead depending on timing and
the worker count. A stage under it counts what it produced for the reader's positions
handed out (or passed over: a filter's rejects), not what was computed ahead, so a stream
that stops early (`limit`, a mixture whose component ran out, an early close) counts the
same for any worker count (docs/metrics.md).

The reader asks for each block with one outermost call of the timed chain
(`instrument._TimedMapDataset`); the calls that makes to the stages below it are noted on a
thread-local stack, each with its caller, and when the outermost call returns, each
stage's elements are put at the reader's positions (`Call.positions`):

- a call with as many indices as its caller's reads them position for position (maps,
  filters, shuffle, slice, repeat, a window shuffle);
- one with r times as many, rounded up (a batch), r per position of the caller;
- one with fewer (a mixture's, a concatenation's or a cache's part): at the last position
  of its caller's call.

Each stage's record keeps the block as a `Block` (the reader's positions and the
cumulative counts at them). In worker processes the blocks travel back with the other
figures (`StageRecord.take_delta`). The reader's timed iterator credits them up to the
reader's position (`DatasetIterator.handed_out_to`) whenever the figures are read
(`settle`), and drops what was computed ahead when it is restored elsewhere.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from chute._src.debug.records import StageRecord

lock = threading.Lock()  # records' blocks: added by computing threads, read by the consumer
_calls = threading.local()  # .stack: the timed calls in progress on this thread


class Block:
    """One block a stage computed for a reader: the reader's positions (ascending), the
    stage's elements up to each (`cum[j]`: before `positions[j]`), and the position up to
    which they have been credited."""

    __slots__ = ("credited", "cum", "positions")

    def __init__(self, positions: np.ndarray, counts: np.ndarray) -> None:
        self.positions = positions
        self.cum = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        self.credited = -1

    def __getstate__(self) -> tuple[Any, ...]:
        return self.positions, self.cum, self.credited

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.positions, self.cum, self.credited = state

    def credit(self, start: int, end: int) -> int:
        """The elements at positions in [max(start, credited), end), now credited."""
        lo = max(start, self.credited)
        if lo >= end:
            return 0
        a, b = np.searchsorted(self.positions, [lo, end])
        self.credited = end
        return int(self.cum[b] - self.cum[a])


class Call:
    """A timed call in progress: its stage's record, its indices, what it produced and the
    calls it made."""

    __slots__ = ("calls", "n", "produced", "record")

    def __init__(self, record: StageRecord, n: int) -> None:
        self.record, self.n = record, n
        self.produced: np.ndarray | None = None
        self.calls: list[Call] = []

    def positions(self, caller: np.ndarray) -> np.ndarray:
        """The reader's position of each of this call's elements, `caller` being its
        caller's (module docstring)."""
        m = len(caller)
        if self.n == m:
            return caller
        if m == 0:  # (no caller's position to put them at: never credited)
            return np.full(self.n, -1, dtype=np.int64)
        if self.n > m:
            r = -(-self.n // m)
            return caller[np.minimum(np.arange(self.n) // r, m - 1)]
        return np.full(self.n, caller[-1])


def enter(record: StageRecord, n: int) -> tuple[Call, bool]:
    """Notes a call of `record`'s stage with `n` indices; (the call, whether it is the
    outermost one: the reader's)."""
    stack: list[Call] | None = getattr(_calls, "stack", None)
    if stack is None:
        stack = _calls.stack = []
    call = Call(record, n)
    if stack:
        stack[-1].calls.append(call)
    stack.append(call)
    return call, len(stack) == 1


def leave(call: Call, produced: np.ndarray | None, indices: np.ndarray, outermost: bool) -> None:
    """Ends `call` (`produced`: which of its elements are not None; None when it raised).
    The outermost call puts every stage's elements at the reader's positions `indices`."""
    _calls.stack.pop()
    call.produced = produced
    if not outermost or produced is None:
        return
    per: dict[int, tuple[StageRecord, list[tuple[np.ndarray, np.ndarray]]]] = {}
    todo = [(call, np.asarray(indices, dtype=np.int64))]
    while todo:
        c, at = todo.pop()
        if c.produced is None:
            continue
        per.setdefault(c.record.id, (c.record, []))[1].append((at, c.produced))
        todo.extend((child, child.positions(at)) for child in c.calls)
    for record, parts in per.values():
        at = np.concatenate([p for p, _ in parts])
        made = np.concatenate([m for _, m in parts]).astype(np.int64)
        order = np.argsort(at, kind="stable")
        block = Block(at[order], made[order])
        with lock:
            record.blocks.append(block)


def settle(records: list[StageRecord], start: int, end: int) -> None:
    """Credits the blocks of `records` (a reader's chain) at positions in [start, end): the
    reader's positions handed out since it started or was restored at `start`. Blocks
    wholly before `end` are dropped once credited."""
    with lock:
        for r in records:
            if not r.blocks:
                continue
            kept = []
            for b in r.blocks:
                r.elements += b.credit(start, end)
                if len(b.positions) and b.positions[-1] >= end:
                    kept.append(b)
            r.blocks = kept


def drop(records: list[StageRecord]) -> None:
    """Forgets the blocks of `records` not handed out (computed ahead of a restore)."""
    with lock:
        for r in records:
            r.blocks = []
