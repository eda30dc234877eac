"""How a `to_iter_dataset` reader gets its chunks: one `ChunkExecutor` per iterator.

The reader (`_src/iter/prefetch.py`) owns the position, the state and the buffer being
consumed; its executor computes elements `[start, ...)` of the MapDataset when asked:

- `InProcess`: on the consumer's thread, a block at a time; the block grows while
  blocks take under 2 ms (to 4096) and shrinks when they take over 20 ms.
- `Threads`: chunks submitted to a thread pool, consumed in order, at most
  `prefetch_buffer_size` elements (and `PREFETCH_BYTES` of arrays) ahead.
- worker processes: `_src/iter/mp_prefetch.py`'s `WorkerChunks`, on the same interface.

Which one runs is chosen by the reader (`ReadOptions`, or `mp_prefetch`'s rewrite); the
elements never depend on it. Every executor surfaces an element's exception at that
element: the elements before it come first.
"""

from __future__ import annotations

import abc
import collections
import time
import weakref
from concurrent import futures
from typing import Any

import numpy as np

_MIN_BLOCK, _MAX_BLOCK = 1, 4096
_FAST_BLOCK_S, _SLOW_BLOCK_S = 0.002, 0.02
PREFETCH_BYTES = 256 << 20
"""At most this many bytes of arrays are computed ahead by the threads (besides the
element count of `ReadOptions.prefetch_buffer_size`)."""


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
    def next_chunk(self, start: int) -> list[Any]:
        """Elements from index `start` on (at least one; `start < length`). An element
        that raises: the elements before it, then the exception on the next call."""

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


def getitems_exact(ds: Any, start: int, k: int) -> tuple[list[Any], bool]:
    """Elements `[start, start + k)`, and whether one failed: a block that raises is
    recomputed one element at a time, so the elements before the failing one are returned
    (and the failing one raises when asked for alone, as the first of a later chunk)."""
    try:
        return ds._getitems(np.arange(start, start + k, dtype=np.int64)), False
    except Exception:
        if k == 1:
            raise
    items: list[Any] = []
    for i in range(start, start + k):
        try:
            items.extend(ds._getitems(np.array([i], dtype=np.int64)))
        except Exception:
            if not items:
                raise
            break
    return items, True


class InProcess(ChunkExecutor):
    """Computes a block on the consumer's thread, sized to take 2 to 20 ms."""

    def __init__(self, ds: Any) -> None:
        super().__init__(ds)
        self._block = 16

    def next_chunk(self, start: int) -> list[Any]:
        k = min(self._block, self.length - start)
        t0 = time.perf_counter()
        items, failed = getitems_exact(self.ds, start, k)
        dt = time.perf_counter() - t0
        if failed:
            self._block = 1
        elif dt < _FAST_BLOCK_S and self._block < _MAX_BLOCK:
            self._block *= 2
        elif dt > _SLOW_BLOCK_S and self._block > _MIN_BLOCK:
            self._block //= 2
        return items


class Threads(ChunkExecutor):
    """Chunks of consecutive indices computed on a thread pool, consumed in order."""

    concurrent = True

    def __init__(self, ds: Any, threads: int, buffer_size: int) -> None:
        super().__init__(ds)
        self._threads = threads
        self._buffer_size = buffer_size
        self._executor: futures.ThreadPoolExecutor | None = None
        self._pending: collections.deque[tuple[int, int, Any]] = collections.deque()
        self._submitted = 0  # next index to submit to the pool
        self._max_chunk = max(1, min(256, buffer_size // max(1, 2 * threads)))
        self._element_bytes: float | None = None  # measured on the first chunk

    def _ensure_pool(self) -> futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="chute-read"
            )
            weakref.finalize(self, _shutdown, self._executor)
        return self._executor

    def _ahead_limit(self) -> int:
        """How many elements may be computed ahead: `prefetch_buffer_size`, and no more
        than PREFETCH_BYTES of arrays once an element's size is known (500 batches of
        images would be gigabytes)."""
        if self._element_bytes is None:
            # Until the first element arrives, compute only it: on a machine with fewer
            # cores than threads, 16 elements started at once would all finish late.
            return 1
        limit = self._buffer_size
        if self._element_bytes:
            limit = min(limit, max(self._threads, int(PREFETCH_BYTES // self._element_bytes)))
        return max(1, limit)

    def _top_up(self) -> None:
        ahead = self._ahead_limit()
        chunk = max(1, min(self._max_chunk, ahead // max(1, 2 * self._threads)))
        limit = max(1, ahead // chunk)
        while len(self._pending) < limit and self._submitted < self.length:
            start = self._submitted
            k = min(chunk, self.length - start)
            idx = np.arange(start, start + k, dtype=np.int64)
            self._pending.append((start, k, self._ensure_pool().submit(self.ds._getitems, idx)))
            self._submitted = start + k

    def next_chunk(self, start: int) -> list[Any]:
        if not self._pending or self._pending[0][0] != start:
            self.seek(start)
        self._top_up()
        _, k, fut = self._pending.popleft()
        self._top_up()
        if fut.exception() is None:
            items: list[Any] = fut.result()
            if self._element_bytes is None and items:
                self._element_bytes = nbytes(items) / len(items)
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
        if self._executor is not None:
            _shutdown(self._executor)
            self._executor = None


def _shutdown(executor: futures.ThreadPoolExecutor) -> None:
    executor.shutdown(wait=False, cancel_futures=True)


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
