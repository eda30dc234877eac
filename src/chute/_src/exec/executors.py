"""How a `to_iter_dataset` reader gets its chunks: one `ChunkExecutor` per iterator.

The reader (`_src/exec/reader.py`) owns the position, the state and the buffer being
consumed; its executor computes elements `[start, ...)` of the MapDataset when asked:

- `InProcess`: on the consumer's thread, a block at a time; the block grows while
  blocks take under 8 ms (to 4096) and shrinks when they take over 50 ms.
- `Threads`: chunks submitted to a thread pool (`threadpool.ComputePool`), consumed in
  order, at most `prefetch_buffer_size` elements (and `PREFETCH_BYTES` of arrays) ahead;
  a chunk holds about `CHUNK_S` of work once an element's time is measured (a source
  read per element costs little in a chunk of 50, much in chunks of 4).
- `Autotuned`: `ReadOptions(num_threads=AUTOTUNE)`: `InProcess` or `Threads`, the number
  of threads (0 to 64) chosen from the consumer's rate by a `HillClimb`
  (`_src/exec/autotune.py`), starting higher when the elements after the first spent their
  time waiting rather than computing; with `prefetch_buffer_size=AUTOTUNE` too, the
  elements computed ahead doubled by a second climb while the consumer finds nothing
  ready and that pays.
- worker processes: `_src/exec/workers/feeding.py`'s `WorkerChunks`, on the same interface.

Which one runs is chosen by the reader (`ReadOptions`, or `mp_prefetch`'s rewrite); the
elements never depend on it. Every executor surfaces an element's exception at that
element: the elements before it come first.
"""

from __future__ import annotations

import abc
import collections
import time
from typing import Any, TypeVar

import numpy as np

from chute._src.core import contract, in_flight, machine
from chute._src.core.columns import Columns
from chute._src.core.node import walk
from chute._src.core.tuning import Parallelism
from chute._src.exec import autotune
from chute._src.exec.threadpool import ComputePool

_MIN_BLOCK, _MAX_BLOCK = 1, 4096
_FIRST_BLOCK = 16  # the most the block after the first one-element block holds
_FAST_BLOCK_S, _SLOW_BLOCK_S = 0.008, 0.05
CHUNK_S = 0.01
"""A thread's chunk aims at about this much work: per-chunk costs (a batched source
read, a future, the GIL handed over) stay small beside it."""
PREFETCH_BYTES = 256 << 20
"""At most this many bytes of arrays are computed ahead by the threads (besides the
element count of `ReadOptions.prefetch_buffer_size`)."""


Chunk = list[Any] | Columns
"""Consecutive elements, as an executor hands them to the reader."""


def reads_in_flight(ds: Any) -> int:
    """The most reads in flight that a source under the node `ds` declares (0: none): a
    latency-bound source's `reads_in_flight` (`_src/core/in_flight.py`), found through
    the node protocol (`parents`, `role`, and a `SOURCE` node's `data_source`)."""
    most = 0
    for node in walk(ds):
        source = contract.source_object(node)
        if source is not None:
            most = max(most, in_flight.declared(source))
    return most


class ChunkExecutor(abc.ABC):
    """Computes consecutive elements of `ds` (a MapDataset) for one reader iterator."""

    concurrent: bool = False
    """True when chunks are computed on other threads or processes."""

    bound_to_thread: bool = False
    """True when only the thread that created it may ask for chunks."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds
        self.length = len(ds)

    @abc.abstractmethod
    def next_chunk(self, start: int) -> Chunk:
        """Elements from index `start` on (at least one; `start < length`). An element
        that raises: the elements before it, then the exception on the next call. A list,
        or `Columns` from worker processes (`core/columns.py`)."""

    def seek(self, start: int) -> None:  # noqa: B027 (optional)
        """The next chunk asked for starts at `start`: drop what was computed ahead."""

    def start(self) -> None:  # noqa: B027 (optional)
        """Starts computing ahead now (`start_prefetch`)."""

    def in_flight(self) -> int:
        """Elements being computed ahead."""
        return 0

    def release(self) -> None:  # noqa: B027 (optional)
        """Drops work ahead and frees threads; the executor still works after it."""

    def close(self) -> None:
        self.release()

    def tuning(self) -> autotune.Tuning | None:
        """What AUTOTUNE chose for this executor, and why; None when nothing is tuned."""
        return None

    def parallelism(self) -> Parallelism:
        """The threads or processes computing the chunks now."""
        return Parallelism()


def getitems_exact(ds: Any, start: int, k: int) -> tuple[list[Any], bool]:
    """Elements `[start, start + k)`, and whether one failed: a block that raises is
    recomputed by `elements_before_failure`, so the elements before the failing one are
    returned (and the failing one raises when asked for alone, as the first of a later
    chunk)."""
    try:
        return ds._getitems(np.arange(start, start + k, dtype=np.int64)), False
    except Exception as e:
        failure: Exception = e
    # Outside the handler: an element's exception does not carry the block's as context.
    items, exc = elements_before_failure(ds, start, k, failure, Exception)
    del failure  # (its traceback holds this frame: no cycle through the locals)
    if exc is not None and not items:
        try:
            raise exc
        finally:
            del exc
    return items, True


E = TypeVar("E", bound=BaseException)


def elements_before_failure(
    ds: Any, start: int, k: int, exc: E, catch: type[E] | tuple[type[E], ...]
) -> tuple[list[Any], E | None]:
    """The one recompute-on-failure path of every executor (threads, the consumer's
    thread, worker processes): `exc` was raised computing elements `[start, start + k)`
    as one block; they are computed again one at a time, up to the first that raises one
    of `catch`, so every element before it comes out before its error. Returns those
    elements and that element's exception (`exc` itself when `k` is 1; None if each
    element alone succeeds)."""
    if k == 1:
        return [], exc
    items: list[Any] = []
    for i in range(start, start + k):
        try:
            items.extend(ds._getitems(np.array([i], dtype=np.int64)))
        except catch as e:
            return items, e
    return items, None


class InProcess(ChunkExecutor):
    """Computes a block on the consumer's thread, sized to take 2 to 20 ms. The first
    block is one element, so that slow elements are not computed ahead of a consumer
    that may never ask for them; after it, the block is what 8 ms of elements like it
    take (at most 16), then doubles while fast and halves while slow."""

    def __init__(self, ds: Any) -> None:
        super().__init__(ds)
        self._block = 1
        self._first = True

    def next_chunk(self, start: int) -> list[Any]:
        k = min(self._block, self.length - start)
        t0 = time.perf_counter()
        items, failed = getitems_exact(self.ds, start, k)
        dt = time.perf_counter() - t0
        first, self._first = self._first, False
        if failed:
            self._block = 1
        elif first:
            self._block = max(1, min(_FIRST_BLOCK, int(_FAST_BLOCK_S / max(dt, 1e-9))))
        elif dt < _FAST_BLOCK_S and self._block < _MAX_BLOCK:
            self._block *= 2
        elif dt > _SLOW_BLOCK_S and self._block > _MIN_BLOCK:
            self._block //= 2
        return items


def _timed_getitems(
    ds: Any, idx: np.ndarray, queue: bool
) -> tuple[list[Any], float, float, float, float]:
    """`ds._getitems(idx)`, the wall-clock seconds it took, the CPU seconds of the thread
    that ran it, the seconds that thread waited for a CPU, and the seconds the process's
    other threads computed or waited for a CPU meanwhile. The waits for a CPU only with
    `queue` (else 0: reading them costs /proc reads, ~10-20 us each, twice): without them,
    threads that other processes kept off the CPUs look idle (waiting on I/O) when they
    were taking turns at the GIL."""
    # The /proc reads release the GIL, and may wait to take it back while other threads
    # compute: they stay outside the three clocks, which are read together (reading the
    # wall clock before them counted such a wait as this chunk's, the others' CPU meanwhile
    # not, and a chunk of pure Python looked as if it waited on I/O).
    q0, all0 = (
        (machine.thread_queued_seconds(), machine.process_queued_seconds() or 0.0)
        if queue
        else (0.0, 0.0)
    )
    t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
    items = ds._getitems(idx)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    process_cpu = time.process_time() - p0
    queued = others_queued = 0.0
    if queue:
        queued = machine.thread_queued_seconds() - q0
        others_queued = max(0.0, (machine.process_queued_seconds() or 0.0) - all0 - queued)
    return items, wall, cpu, queued, process_cpu - cpu + others_queued


class Threads(ChunkExecutor):
    """Chunks of consecutive indices computed on a thread pool, consumed in order."""

    concurrent = True

    def __init__(
        self, ds: Any, threads: int, buffer_size: int, max_bytes: int = PREFETCH_BYTES
    ) -> None:
        super().__init__(ds)
        self._threads = threads
        self._buffer_size = buffer_size
        self._max_bytes = max_bytes
        self._pool = ComputePool(max(1, threads), "chute-read")
        self._pending: collections.deque[tuple[int, int, Any]] = collections.deque()
        self._submitted = 0  # next index to submit to the pool
        self._max_chunk = max(1, min(256, buffer_size // max(1, 2 * threads)))
        self._element_bytes: float | None = None  # measured on the first chunk
        self.element_s: float | None = None  # seconds per element, the latest chunks'
        # Seconds per element in the first chunk, if it computed (not if it waited on
        # I/O): start-up costs included, so too high; it sizes chunks (smaller, never
        # larger, than they should be) until element_s.
        self._first_element_s: float | None = None
        # The latest chunk's share of its wall-clock time that its thread was on a CPU or
        # waiting for one, and the CPU time of the process's other threads meanwhile.
        self.cpu_shares: tuple[float, float] | None = None
        # How many chunks, from the first submitted, measure their thread's time waiting
        # for a CPU (for cpu_shares: the first chunk's, and AUTOTUNE's start decision).
        self.queue_chunks = 1
        self._chunks = 0  # chunks submitted so far
        self.waited = False  # the last chunk was not ready when the consumer asked for it

    def resize(self, threads: int, buffer_size: int) -> None:
        """Computes with `threads` threads and `buffer_size` elements ahead from now on:
        chunks running finish where they are, chunks queued move to the new pool (128
        reads of 2-20 ms queued for 2 threads took ~0.7 s to drain at that pace)."""
        resized = threads != self._threads
        self._threads, self._buffer_size = threads, buffer_size
        self._max_chunk = max(1, min(256, buffer_size // max(1, 2 * threads)))
        if resized:
            self._pool.resize(threads)
            moved: collections.deque[tuple[int, int, Any]] = collections.deque()
            for start, k, fut in self._pending:
                if fut.cancel():  # not started: the new pool computes it, once
                    idx = np.arange(start, start + k, dtype=np.int64)
                    fut = self._submit(idx)
                moved.append((start, k, fut))
            self._pending = moved

    def parallelism(self) -> Parallelism:
        return Parallelism(threads=self._threads)

    def _submit(self, idx: np.ndarray) -> Any:
        self._chunks += 1
        queue = self._chunks <= self.queue_chunks
        return self._pool.submit(_timed_getitems, self.ds, idx, queue)

    def _ahead_limit(self, max_bytes: int | None = None) -> int:
        """How many elements may be computed ahead: `prefetch_buffer_size`, and no more
        than `max_bytes` (default: this executor's, PREFETCH_BYTES unless AUTOTUNE gave
        more) of arrays once an element's size is known (500 batches of images would be
        gigabytes)."""
        if self._element_bytes is None:
            # Until the first element arrives, compute only it: on a machine with fewer
            # cores than threads, 16 elements started at once would all finish late.
            return 1
        limit = self._buffer_size
        if self._element_bytes:
            cap = self._max_bytes if max_bytes is None else min(max_bytes, self._max_bytes)
            limit = min(limit, max(self._threads, int(cap // self._element_bytes)))
        return max(1, limit)

    def _top_up(self, max_bytes: int | None = None) -> None:
        ahead = self._ahead_limit(max_bytes)
        chunk = max(1, min(self._max_chunk, ahead // max(1, 2 * self._threads)))
        element_s = self.element_s or self._first_element_s
        if element_s:
            chunk = max(1, min(chunk, round(CHUNK_S / element_s)))
        limit = max(1, ahead // chunk)
        while len(self._pending) < limit and self._submitted < self.length:
            start = self._submitted
            k = min(chunk, self.length - start)
            idx = np.arange(start, start + k, dtype=np.int64)
            fut = self._submit(idx)
            self._pending.append((start, k, fut))
            self._submitted = start + k

    def next_chunk(self, start: int) -> list[Any]:
        if not self._pending or self._pending[0][0] != start:
            self.seek(start)
        self._top_up()
        _, k, fut = self._pending.popleft()
        self._top_up()
        self.waited = not fut.done()
        if fut.exception() is None:
            items, wall, cpu, queued, others = fut.result()
            self.cpu_shares = ((cpu + queued) / wall, others / wall) if wall > 0 else None
            if self._element_bytes is None and items:
                self._element_bytes = nbytes(items) / len(items)
                if wall > 0 and cpu + queued >= _WAITING_SHARE * wall:
                    # Computing: its time sizes the chunks. Not when it mostly waited (a
                    # read's round trip): a chunk of many such reads waits about as long.
                    self._first_element_s = wall / len(items)
                # The element size is known: compute ahead now, while the consumer works
                # on this chunk (not only at its next call), PREFETCH_BYTES of arrays at
                # most until it calls again.
                self._top_up(PREFETCH_BYTES)
            elif items and wall > 0:
                # Not the first: it holds start-up costs (opening files, loading a model).
                # Its thread's CPU time, or the process's CPU time meanwhile shared by the
                # threads (threads that wait for the GIL take longer than their work); not
                # the time it waited on I/O or a sleep: a chunk of many reads in flight at
                # once waits about as long as a chunk of one.
                per = min(wall, max(cpu, (cpu + others) / self._threads)) / len(items)
                self.element_s = per if self.element_s is None else 0.7 * self.element_s + 0.3 * per
            return items
        # Recompute in this thread, one by one, so the error surfaces at its element.
        return getitems_exact(self.ds, start, k)[0]

    def seek(self, start: int) -> None:
        for _, _, fut in self._pending:
            fut.cancel()
        self._pending.clear()
        self._submitted = start

    def start(self) -> None:
        self._top_up()

    def in_flight(self) -> int:
        return sum(k for _, k, _ in self._pending)

    def release(self) -> None:
        self.seek(self._submitted)
        self._pool.release()


_THREAD_CHOICES = (0, 1, 2, 4, 8, 16, 32, autotune.MAX_THREADS)
_FIRST_BUFFER, _MAX_BUFFER = 128, 4096
_WAITING_SHARE = 0.4
"""A chunk after the first whose thread computed (or waited for a CPU) for less than this
share of its wall-clock time (the rest waiting on I/O) starts the thread climb at
`_WAITING_START` threads. A chunk that computes measures near 1 on its thread (about 1/n
with n threads taking turns at the GIL); a 5 ms sleep, near 0."""
_BUSY_ELSEWHERE = 0.5
"""...unless the process's other threads computed (or waited for a CPU) for this share of
that time or more:
then the chunk's thread may have waited for the GIL, not for I/O (the consumer builds the
rest of the pipeline while the first chunk is computed), and the next chunk is measured
instead, up to `_START_CHUNKS` chunks; after that the climb starts at the cores."""
_START_CHUNKS = 4
_WAITING_START = 16
_PER_THREAD = 8


def start_verdict(shares: tuple[float, float] | None, last: bool) -> bool | None:
    """Whether a chunk's figures (`Threads.cpu_shares`) say its elements wait (True: start
    the climb at `_WAITING_START` threads) or compute (False: at the cores); None when they
    cannot tell (the thread idle while others computed: a GIL wait?) and this is not the
    `last` chunk measured for it."""
    if shares is None or shares[0] >= _WAITING_SHARE:
        return False
    if shares[1] >= _BUSY_ELSEWHERE:
        return False if last else None
    return True


class Autotuned(ChunkExecutor):
    """`ReadOptions` with AUTOTUNE: the consuming thread (0 threads) or a thread pool, the
    number of threads chosen by a `HillClimb` on the consumer's rate (or fixed); with
    `prefetch_buffer_size=AUTOTUNE` too, once the threads are chosen and only while the
    consumer finds the next chunk not computed yet, a second climb doubles the elements
    computed ahead while that clearly raises the rate, up to the memory budget for the
    element size seen. Starts with as many threads as usable cores, at most 4 (16 when a
    chunk after the first spent most of its time waiting, not computing); nothing is
    measured on the first chunk (first-element costs such as loading a model would count
    against the first setting).
    """

    concurrent = True

    def __init__(self, ds: Any, threads: int | None, buffer_size: int | None) -> None:
        super().__init__(ds)
        self._tuning = autotune.Tuning()
        self._fixed_threads = threads
        self._fixed_buffer = buffer_size
        self._budget = machine.memory_budget()
        self._threads = threads if threads is not None else min(machine.usable_cores(), 4)
        declared = reads_in_flight(ds)  # latency-bound sources: reads ahead
        first = max(_FIRST_BUFFER, declared)
        self._buffer = buffer_size if buffer_size is not None else first
        if buffer_size is None:
            because = (
                f"{declared} reads in flight declared by a source; "
                if declared > _FIRST_BUFFER
                else ""
            )
            self._tuning.note(
                "prefetch_buffer_size",
                self._buffer,
                f"{because}start; doubled while the consumer waits and that pays, to {_MAX_BUFFER} "
                f"elements and {self._budget / (1 << 20):,.0f} MiB of arrays (a quarter of "
                "the available memory)",
            )
        self._climb: autotune.HillClimb | None = None
        self._buffer_climb: autotune.HillClimb | None = None
        self._local = InProcess(ds)
        self._pool = Threads(ds, max(1, self._threads), self._buffer, self._budget)
        self._pool.queue_chunks = 1 + _START_CHUNKS  # the start decision's figures
        self._first = True
        self._element_bytes = 0.0  # measured on the first chunk
        self._start_chunks = 0  # chunks left to tell waiting elements from computing ones

    @property
    def _uses_threads(self) -> bool:
        return self._threads > 0 and self._buffer > 0

    def next_chunk(self, start: int) -> list[Any]:
        if self._uses_threads:
            items = self._pool.next_chunk(start)
        else:
            items = self._local.next_chunk(start)
        if self._first:
            self._first = False
            self._element_bytes = nbytes(items) / max(1, len(items))
            if self._fixed_threads is None:
                # Not measured: the first chunk holds one-off costs (imports, opening
                # files, the first call of each function), which a 5 ms read can exceed.
                self._start_chunks = _START_CHUNKS
            return items
        if self._start_chunks:
            self._start_chunks -= 1
            self._start_climb(start + len(items))
            return items
        climb, buffers = self._climb, self._buffer_climb
        if buffers is not None and not buffers.settled:
            buffer = buffers.observe(len(items))
            if buffer != self._buffer:
                self._buffer = buffer
                self._pool.resize(self._threads, buffer)
        elif climb is not None and (
            not climb.settled or buffers is not None or not self._may_grow_buffer()
        ):
            threads = climb.observe(len(items))
            if threads != self._threads:
                self._switch(threads, start + len(items))
        elif self._may_grow_buffer():
            self._start_buffer_climb()
        return items

    def _start_climb(self, next_index: int) -> None:
        """Starts the thread climb at 16 threads if the chunk just consumed (the second,
        or a later one) mostly waited, else at the cores; or, if its figures cannot tell
        (see `_BUSY_ELSEWHERE`), leaves it to the next chunk."""
        shares = self._pool.cpu_shares if self._uses_threads else None
        verdict = start_verdict(shares, last=not self._start_chunks)
        if verdict is None:
            return  # it may have waited for the GIL: measure the next chunk
        if verdict and shares is not None:
            threads = max(n for n in self._choices() if n <= _WAITING_START)
            self._tuning.note(
                "num_threads",
                threads,
                f"the first elements computed for {shares[0]:.0%} of their time (they "
                "waited on reads, a sleep or a lock): starting the climb there",
            )
            self._switch(threads, next_index)
        self._start_chunks = 0
        self._climb = autotune.HillClimb(
            "num_threads",
            self._choices(),
            self._threads,
            self._tuning,
            "elements",
            watch_cpu=True,
        )

    def _may_grow_buffer(self) -> bool:
        """The buffer is autotuned, not climbed yet for these threads, and the consumer
        found the last chunk not computed yet."""
        return (
            self._fixed_buffer is None
            and self._buffer_climb is None
            and self._uses_threads
            and self._pool.waited
        )

    def _start_buffer_climb(self) -> None:
        cap = _MAX_BUFFER
        if self._element_bytes:
            cap = max(1, min(cap, int(self._budget // self._element_bytes)))
        values = [self._buffer]
        while values[-1] * 2 <= cap:
            values.append(values[-1] * 2)
        self._buffer_climb = autotune.HillClimb(
            "prefetch_buffer_size",
            values,
            self._buffer,
            self._tuning,
            "elements",
            up_only=True,
        )

    def _choices(self) -> list[int]:
        """Thread counts whose chunks in flight fit the memory budget."""
        per_element = self._element_bytes
        most = autotune.MAX_THREADS
        if per_element:
            most = max(1, min(most, int(self._budget // (2 * per_element))))
        return [n for n in _THREAD_CHOICES if n <= most]

    def _switch(self, threads: int, next_index: int) -> None:
        if threads == 0:
            self._pool.seek(next_index)  # drop what the threads computed ahead
            self._pool.release()
        elif self._threads == 0:
            self._pool.seek(next_index)
        self._threads = threads
        self._buffer_climb = None  # the buffer is climbed again for these threads
        if threads and self._fixed_buffer is None and self._buffer < _PER_THREAD * threads:
            # Chunks of one element each would cost the consumer a future per element.
            self._buffer = _PER_THREAD * threads
            self._tuning.note(
                "prefetch_buffer_size", self._buffer, f"{_PER_THREAD} elements per thread"
            )
        if threads:
            self._pool.resize(threads, max(self._buffer, 2 * threads))

    def seek(self, start: int) -> None:
        self._pool.seek(start)

    def start(self) -> None:
        if self._uses_threads:
            self._pool.start()

    def in_flight(self) -> int:
        return self._pool.in_flight()

    def release(self) -> None:
        self._pool.release()

    def tuning(self) -> autotune.Tuning:
        return self._tuning

    def parallelism(self) -> Parallelism:
        return Parallelism(threads=self._threads if self._uses_threads else 0)


def nbytes(elements: Any) -> int:
    """Bytes held by the numpy arrays in `elements` (others count as 0)."""
    total = 0
    stack = [elements]
    while stack:
        x = stack.pop()
        if isinstance(x, np.ndarray):
            total += x.nbytes
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
    return total
