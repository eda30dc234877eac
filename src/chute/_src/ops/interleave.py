"""`experimental.InterleaveIterDataset`: read several inputs (files) in parallel threads.

As tf.data's parallel interleave: `cycle_length` inputs are open at a time and the output
takes one element from each in turn; an exhausted input is replaced by the next one. Each
open input (and the next ones to open) is read ahead, `iter_buffer_size` elements at a
time (one read in flight and one chunk buffered per input), on a pool of `parallelism`
threads, so per-read latency (remote storage) overlaps across inputs while the output
order stays a fixed function of the inputs: Grain's order, whatever the timing or the
number of threads. `parallelism=AUTOTUNE` (the default) starts with one thread per open
input and per input opened ahead and lets a `HillClimb` (`_src/exec/autotune.py`) on the
consumer's rate choose how many inputs are read concurrently: `parallelism` threads,
and the inputs beyond the cycle opened ahead to keep them busy.

The inputs are the shards of one stream, each read whole and on its own (`reads_shards`,
`_src/core/contract.py`): under `mp_prefetch`, worker processes read them (docs/design.md).

The state holds, for every slot of the cycle, which input is there and its position: the
input's state before the chunk being consumed plus how many of the chunk were taken. An
empty slot is `input` -1 with the state the next input to open starts from, so the state
keeps one shape for the whole run (where the inputs' states have one shape).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

from chute._src.core import provenance_replay as replay
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import (
    DatasetIterator,
    bad_value,
    check_int,
    check_state,
    walk_iterators,
)
from chute._src.core.set_slice import SetSliceError, check_unbuilt, reset_memos
from chute._src.exec import autotune
from chute._src.exec.autotune import AUTOTUNE, Autotune
from chute._src.exec.threadpool import ComputePool


class InterleaveIterDataset(IterDataset[Any]):
    """Interleaves `datasets`, `cycle_length` at a time, reading them in parallel threads.

    The rule: `cycle_length` slots, visited in turn. A slot reached empty takes the next
    input in list order. A slot gives the next element of its input; one whose input has
    ended gives nothing this turn and is emptied. `parallelism` is how many threads read
    ahead (tf.data's `num_parallel_calls`); 0 reads on the consumer's thread; None is
    `cycle_length + num_make_iter_threads`, one per open input and per input opened ahead;
    `chute.AUTOTUNE` (the default) starts there and is tuned while the pipeline runs
    (more threads open more inputs ahead; `iter(ds).tuning()` says what it chose and
    why). It changes when elements are read, never which come out or their order, nor
    the state.

    >>> import chute
    >>> files = [chute.MapDataset.range(10 * i, 10 * i + 3) for i in range(4)]
    >>> ds = chute.experimental.InterleaveIterDataset(files, cycle_length=2)
    >>> list(ds)
    [0, 10, 1, 11, 2, 12, 20, 30, 21, 31, 22, 32]
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(
        self,
        datasets: Sequence[IterDataset[Any] | MapDataset[Any]],
        *,
        cycle_length: int,
        num_make_iter_threads: int = 1,
        make_iter_buffer_size: int = 1,
        iter_buffer_size: int = 8,
        parallelism: int | Autotune | None = AUTOTUNE,
    ) -> None:
        where = "InterleaveIterDataset"
        inputs = list(datasets)
        if not all(isinstance(d, IterDataset | MapDataset) for d in inputs):
            raise TypeError(
                f"{where}: datasets must be a list of IterDatasets or MapDatasets (one per file, "
                f"say); got {[type(d).__name__ for d in inputs]}."
            )
        for name, value in (
            ("cycle_length", cycle_length),
            ("num_make_iter_threads", num_make_iter_threads),
            ("make_iter_buffer_size", make_iter_buffer_size),
            ("iter_buffer_size", iter_buffer_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{where}: {name}={value!r} is invalid: it must be a positive int."
                )
        if (
            parallelism is not None
            and parallelism is not AUTOTUNE
            and (
                isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 0
            )
        ):
            raise ValueError(
                f"{where}: parallelism={parallelism!r} is invalid: it must be an int >= 0 "
                "(threads reading ahead; 0 reads on the consumer's thread), None for one "
                "thread per open input, or chute.AUTOTUNE to have it tuned."
            )
        parents = [d.to_iter_dataset() if isinstance(d, MapDataset) else d for d in inputs]
        super().__init__(parents)
        self._cycle = min(cycle_length, max(1, len(parents)))
        self._ahead = make_iter_buffer_size
        self._chunk = iter_buffer_size
        default = self._cycle + num_make_iter_threads
        self._tuned = parallelism is AUTOTUNE
        self._threads = default if parallelism is None or parallelism is AUTOTUNE else parallelism

    _reads_shards = True  # each input is one shard, read whole: see `core/contract.py`
    _slices_in_place = True

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Grain's hook: from now on, interleave only `datasets[sl]` of the ones it has
        (`core/set_slice.py`); only before stages are built on it. chute's workers never
        need it: `mp_prefetch` reads each input in a worker process by itself.

        >>> import chute
        >>> files = [chute.MapDataset.range(10 * i, 10 * i + 2) for i in range(4)]
        >>> ds = InterleaveIterDataset(files, cycle_length=2)
        >>> ds.set_slice(slice(1, 3))
        >>> list(ds)
        [10, 20, 11, 21]
        """
        del sequential_slice  # as Grain's: `datasets[sl]` whatever it says
        check_unbuilt(self, f"{type(self).__name__}.set_slice")
        if not isinstance(sl, slice):
            raise SetSliceError(
                f"{type(self).__name__}.set_slice: sl={sl!r} is not a slice: pass one, "
                "e.g. slice(0, 2) for the first two inputs."
            )
        numbers = self.__dict__.get("_shard_numbers", range(len(self._parents)))
        self._shard_numbers = list(numbers)[sl]  # what provenance shows (`_origins`)
        self._parents = self._parents[sl]
        self._cycle = max(1, min(self._cycle, len(self._parents)))
        reset_memos(self)

    @property
    def parallelism(self) -> int | Autotune:
        """Threads reading the inputs ahead (0: on the consumer's thread), or AUTOTUNE."""
        return AUTOTUNE if self._tuned else self._threads

    def _make_iterator(self) -> DatasetIterator[Any]:
        its = [self._parent_iter(i) for i in range(len(self._parents))]
        return _InterleaveIterator(its, self)

    def __repr__(self) -> str:
        return f"InterleaveIterDataset(cycle_length={self._cycle}, inputs={len(self._parents)})"

    def _fingerprint_params(self) -> str:
        return f"cycle_length={self._cycle}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The shard and its position: this stage's rule run again on its shards' elements,
        each known by its identity (`core/provenance_replay.py`), the shards read as far
        as the rule reaches; the record shows the shard's number (in the list the stage
        was made with, before a `set_slice`)."""
        o = replay.reordered_origins(self, position, tracer)[0]
        assert o.parent is not None
        numbers = self.__dict__.get("_shard_numbers", range(len(self._parents)))
        return [o._replace(fields=(("shard", numbers[o.parent]),))]


_EXHAUSTED = object()


def _read(it: DatasetIterator[Any], skip: int, k: int) -> tuple[dict[str, Any], list[Any]]:
    """The input's state, then its next `skip + k` elements (runs on a reader thread)."""
    return it.get_state(), it._next_many(skip + k)


class _Deferred:
    """A read done on the consumer's thread when its result is first asked for."""

    __slots__ = ("_args", "_out")

    def __init__(self, it: DatasetIterator[Any], skip: int, k: int) -> None:
        self._args: tuple[DatasetIterator[Any], int, int] | None = (it, skip, k)
        self._out: tuple[dict[str, Any], list[Any]] | None = None

    def result(self) -> tuple[dict[str, Any], list[Any]]:
        if self._out is None:
            assert self._args is not None
            args, self._args = self._args, None
            self._out = _read(*args)
        return self._out


class _Feed:
    """One input being read: the chunk being consumed and the read of the next one."""

    __slots__ = ("ended", "future", "items", "pos", "state")

    def __init__(self, state: dict[str, Any], skip: int) -> None:
        self.state = state  # the input's state before `items`
        self.items: list[Any] = []
        self.pos = skip  # consumed position in `items` (skip until a chunk arrives)
        self.future: concurrent.futures.Future[Any] | _Deferred | None = None
        self.ended = False  # the last read came back short: the input raised StopIteration


class _InterleaveIterator(DatasetIterator[Any]):
    stage = "interleave"

    def __init__(self, its: list[DatasetIterator[Any]], ds: InterleaveIterDataset) -> None:
        super().__init__(its)
        self._its = its
        self._inputs = ds.parents  # named (repr) by the error for an input read after its end
        self._n = len(its)
        self._cycle, self._chunk, self._ahead = ds._cycle, ds._chunk, ds._ahead
        self._ahead_fixed = ds._ahead
        self._threads = ds._threads
        self._tuned = ds._tuned
        self._tuning: autotune.Tuning | None = None
        self._climb: autotune.HillClimb | None = None
        self._taken = 0  # elements taken since the tuner last heard
        self._initial = [it.get_state() for it in its]
        self._slots: list[int | None] = [None] * self._cycle
        self._pos = 0  # next slot of the cycle to read
        self._next_input = 0  # next input to open
        self._feeds: dict[int, _Feed] = {}
        self._pool: ComputePool | None = None
        self._inline_reads: list[bool] | None = None
        self._closed = False

    # -- reading ---------------------------------------------------------------------------

    def _inline(self) -> list[bool]:
        """Inputs fed by worker processes are read on the calling thread, when their
        elements are needed: the workers already compute them ahead, and their service is
        not shared across threads. With `parallelism=0` every input is."""
        if self._inline_reads is None:
            self._inline_reads = [not self._threads or _fed_by_workers(it) for it in self._its]
        return self._inline_reads

    def _submit(self, j: int, feed: _Feed, skip: int) -> None:
        if self._closed:
            raise RuntimeError("next() on a closed iterator: create a new one with iter(ds).")
        if self._inline()[j]:
            feed.future = _Deferred(self._its[j], skip, self._chunk)
            return
        if self._pool is None:
            self._pool = ComputePool(self._threads, "chute-interleave")
        feed.future = self._pool.submit(_read, self._its[j], skip, self._chunk)

    def _open(self, j: int, state: dict[str, Any] | None = None, skip: int = 0) -> _Feed:
        feed = self._feeds.get(j)
        if feed is None:
            feed = _Feed(self._initial[j] if state is None else state, skip)
            self._feeds[j] = feed
            self._submit(j, feed, skip)
        return feed

    def _prefetch_next_inputs(self) -> None:
        """Starts reading the inputs that will fill the empty slots, and `ahead` more."""
        empty = sum(1 for s in self._slots if s is None)
        for j in range(self._next_input, min(self._n, self._next_input + empty + self._ahead)):
            self._open(j)

    def _take(self, j: int) -> Any:
        feed = self._feeds[j]
        if feed.pos < len(feed.items):
            x = feed.items[feed.pos]
            feed.pos += 1
            return x
        assert feed.future is not None
        try:
            state, items = feed.future.result()
        except Exception as e:
            if feed.ended:
                raise self._read_after_end(j, e) from e
            raise
        skip = feed.pos - len(feed.items) if feed.items else feed.pos
        feed.ended = len(items) < skip + self._chunk
        feed.future = None
        if len(items) <= skip:
            del self._feeds[j]
            return _EXHAUSTED
        feed.state, feed.items, feed.pos = state, items, skip + 1
        self._submit(j, feed, 0)
        return items[skip]

    def _read_after_end(self, j: int, error: Exception) -> RuntimeError:
        """The error for input `j` raising `error` when read again after it had ended (an
        interleave reads each input until a read comes back empty)."""
        return RuntimeError(
            f"InterleaveIterDataset: input {j} of {self._n} ({self._inputs[j]!r}) raised "
            f"{type(error).__name__}({str(error)!r}) when its iterator was called again after it "
            "was exhausted (it had raised StopIteration). An exhausted iterator must raise "
            "StopIteration again on every later call (Python's iterator protocol): make its "
            "__next__ do so (for example, check whether its file is already closed before "
            "reading)."
        )

    def __next__(self) -> Any:
        if self._closed:
            raise RuntimeError("next() on a closed iterator: create a new one with iter(ds).")
        while True:
            j = self._slots[self._pos]
            if j is not None:
                x = self._take(j)
                if x is not _EXHAUSTED:
                    self._pos = (self._pos + 1) % self._cycle
                    if self._tuned:
                        self._observe()
                    return x
                self._slots[self._pos] = None
                self._pos = (self._pos + 1) % self._cycle
                continue
            if self._next_input < self._n:
                self._prefetch_next_inputs()
                j = self._next_input
                self._next_input += 1
                self._slots[self._pos] = j
                self._open(j)
                self._prefetch_next_inputs()
                continue
            if all(s is None for s in self._slots):
                raise StopIteration
            self._pos = (self._pos + 1) % self._cycle

    # -- AUTOTUNE --------------------------------------------------------------------------

    def _observe(self) -> None:
        """Counts an element taken; every 16, tells the tuner (started at the first)."""
        self._taken += 1
        if self._taken < 16:
            return
        taken, self._taken = self._taken, 0
        if self._climb is None:
            if self._pool is None:  # reads are not on threads (inputs fed by workers)
                self._tuned = False
                return
            self._tuning = autotune.Tuning()
            most = max(self._threads, min(self._n, autotune.MAX_THREADS))
            values = {self._threads, most, *(2**k for k in range(7) if 2**k <= most)}
            self._climb = autotune.HillClimb(
                "parallelism", sorted(values), self._threads, self._tuning, "elements"
            )
            return
        threads = self._climb.observe(taken)
        if threads != self._threads:
            self._resize(threads)

    def _resize(self, threads: int) -> None:
        """Reads on `threads` threads from now on, with the inputs beyond the cycle that
        keep them busy opened ahead (reads in flight finish on the threads they are on)."""
        self._threads = threads
        ahead = max(self._ahead_fixed, threads - self._cycle)
        if ahead != self._ahead:
            self._ahead = ahead
            assert self._tuning is not None
            self._tuning.note("inputs opened ahead", ahead, f"{threads} threads to keep busy")
        if self._pool is not None:
            self._pool.resize(threads)
        self._prefetch_next_inputs()

    def tuning(self) -> autotune.Tuning | None:
        return self._tuning

    # -- state -----------------------------------------------------------------------------

    def _empty_slot_state(self, next_input: int) -> Any:
        """The state an empty slot records: that of the input it would open next (None
        over no inputs at all, as a copy of `sequential_slice` with no shard has)."""
        return self._initial[min(next_input, self._n - 1)] if self._n else None

    def get_state(self) -> dict[str, Any]:
        slots: list[Any] = []
        for j in self._slots:
            if j is None:
                empty = self._empty_slot_state(self._next_input)
                slots.append({"input": -1, "skip": 0, "parent": empty})
                continue
            feed = self._feeds[j]
            slots.append({"input": j, "skip": feed.pos, "parent": feed.state})
        return {
            "stage": self.stage,
            "cycle_pos": self._pos,
            "next_input": self._next_input,
            "slots": slots,
        }

    def _drain(self) -> None:
        """Waits for reads in flight, so no thread touches an input any more."""
        for feed in self._feeds.values():
            if isinstance(feed.future, concurrent.futures.Future):
                concurrent.futures.wait([feed.future])
        self._feeds.clear()

    def _restore(self, state: Any, path: str) -> None:
        check_state(state, self.stage, {"stage", "cycle_pos", "next_input", "slots"}, path)
        pos = check_int(
            state,
            "cycle_pos",
            path,
            0,
            self._cycle - 1,
            f"a slot of the cycle of cycle_length={self._cycle}",
        )
        next_input = check_int(
            state, "next_input", path, 0, self._n, f"the next of the {self._n} inputs to open"
        )
        slots = state["slots"]
        if not isinstance(slots, list) or len(slots) != self._cycle:
            raise CheckpointError(
                f"{path}['slots'] is not a list of {self._cycle} slots: the state is from an "
                "interleave with another cycle_length; restore a state of this pipeline."
            )
        opened: dict[int, tuple[int, int, str]] = {}  # input -> (slot, skip, path)
        for i, slot in enumerate(slots):
            if slot is None:  # an empty slot in the states of chute <= 0.x
                continue
            where = f"{path}['slots'][{i}]"
            if not isinstance(slot, dict) or set(slot) != {"input", "skip", "parent"}:
                raise CheckpointError(
                    f"{where} = {slot!r} is invalid: a slot is a dict with keys "
                    "'input', 'skip' and 'parent'; restore a state of this pipeline."
                )
            j = check_int(
                slot,
                "input",
                where,
                -1,
                next_input - 1,
                f"an input already opened (-1 for an empty slot): {path}['next_input'] is "
                f"{next_input}",
            )
            if j == -1:
                # An empty slot: nothing taken, and the state the next input starts from.
                empty = self._empty_slot_state(next_input)
                try:
                    check_int(slot, "skip", where, 0, 0, "an empty slot has taken nothing")
                    _check_same(slot["parent"], empty, f"{where}['parent']")
                except CheckpointError as e:
                    raise CheckpointError(
                        f"{where}['input'] = -1 (an empty slot) does not fit the rest of the "
                        f"slot: {e}"
                    ) from None
                continue
            if j in opened:
                raise bad_value(
                    where, "input", j, f"input {j} is also in slot {opened[j][0]}: one slot each"
                )
            skip = check_int(
                slot,
                "skip",
                where,
                0,
                self._chunk,
                f"elements taken from one read of iter_buffer_size={self._chunk}",
            )
            opened[j] = (i, skip, where)
        self._drain()
        self._slots = [None] * self._cycle
        for j, (i, skip, where) in opened.items():
            it = self._its[j]
            it._restore(slots[i]["parent"], f"{where}['parent']")
            # Taken here, so a read never holds more than iter_buffer_size elements.
            taken = it._next_many(skip) if skip else []
            if len(taken) < skip:
                raise bad_value(
                    where,
                    "skip",
                    skip,
                    f"input {j} ends before that (found when re-reading it)",
                )
            self._slots[i] = j
            # The feed is where the state says (before `taken`), so get_state() gives it back.
            feed = _Feed(slots[i]["parent"], skip)
            feed.items = taken
            self._feeds[j] = feed
            self._submit(j, feed, 0)
        for j in range(next_input, self._n):
            if j not in self._feeds:
                self._its[j]._restore(self._initial[j], f"{path}['initial'][{j}]")
        self._pos, self._next_input = pos, next_input
        self._prefetch_next_inputs()

    def start_prefetch(self) -> None:
        if not self._closed:
            self._prefetch_next_inputs()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._drain()
        if self._pool is not None:
            self._pool.release()
            self._pool = None
        for it in self._its:
            it.close()


def _check_same(value: Any, expected: Any, path: str) -> None:
    """Raises `CheckpointError` at the first place where `value` differs from `expected`."""
    if isinstance(expected, dict) and isinstance(value, dict) and value.keys() == expected.keys():
        for k in expected:
            _check_same(value[k], expected[k], f"{path}[{k!r}]")
        return
    if isinstance(expected, list) and isinstance(value, list) and len(value) == len(expected):
        for i, (v, e) in enumerate(zip(value, expected)):
            _check_same(v, e, f"{path}[{i}]")
        return
    if value != expected or type(value) is not type(expected):
        raise CheckpointError(
            f"{path} = {value!r} is invalid: an empty slot holds the state the next input "
            f"starts from, {expected!r} here; restore a state taken by get_state() of this "
            "pipeline."
        )


def _fed_by_workers(it: DatasetIterator[Any]) -> bool:
    return any(node.bound_to_thread for node in walk_iterators(it))
