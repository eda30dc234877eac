"""`MapDataset.to_iter_dataset`: iterate a `MapDataset` in index order, in blocks.

With `num_threads=0` the consumer's thread computes a block of consecutive indices per
`_getitems` call; the block grows while blocks are cheap (so per-element overhead is a few
numpy calls shared by up to 4096 elements) and shrinks when they are slow (so little work
is done ahead). With threads, chunks of indices are computed on a pool and consumed in
order. Either way element `i` is `ds[i]`, so the output does not depend on threads, and the
state is one integer: the index of the next element to hand out.
"""

from __future__ import annotations

import collections
import concurrent.futures
import time
import weakref
from typing import Any, TypeVar

import numpy as np

from chute._src import config
from chute._src.dataset import INFINITE, IterDataset, MapDataset
from chute._src.errors import CheckpointError
from chute._src.iterator import MAX_POSITION, DatasetIterator, check_int, int_at
from chute._src.options import ReadOptions
from chute._src.stats import nbytes

T = TypeVar("T")

_MIN_BLOCK, _MAX_BLOCK = 1, 4096
_FAST_BLOCK_S, _SLOW_BLOCK_S = 0.002, 0.02
PREFETCH_BYTES = 256 << 20
"""At most this many bytes of arrays are computed ahead by the threads (besides the
element count of `ReadOptions.prefetch_buffer_size`)."""


class PrefetchIterDataset(IterDataset[T]):
    """An `IterDataset` over a `MapDataset`, skipping filtered (None) elements."""

    def __init__(self, parent: MapDataset[T], read_options: ReadOptions | None = None) -> None:
        if not isinstance(parent, MapDataset):
            raise TypeError(f"to_iter_dataset needs a MapDataset, got {type(parent).__name__}")
        if read_options is not None and not isinstance(read_options, ReadOptions):
            raise TypeError(
                f"to_iter_dataset: read_options={read_options!r} is not a ReadOptions: pass "
                "chute.ReadOptions(num_threads=..., prefetch_buffer_size=...)."
            )
        super().__init__([parent])
        self._map_parent = parent
        self._read_options = read_options or ReadOptions()

    @property
    def map_parent(self) -> MapDataset[T]:
        return self._map_parent

    @property
    def read_options(self) -> ReadOptions:
        return self._read_options

    def _make_iterator(self) -> PrefetchDatasetIterator[T]:
        ds = self._map_parent
        if config.instrumented():
            from chute._src.instrument import timed_map_chain

            ds = timed_map_chain(ds)
        return PrefetchDatasetIterator(ds, self._read_options)

    def __repr__(self) -> str:
        return f"PrefetchIterDataset(read_options={self._read_options})"

    @property
    def fingerprint(self) -> str:
        return self._map_parent.fingerprint


class PrefetchDatasetIterator(DatasetIterator[T]):
    stage = "to_iter_dataset"

    def __init__(self, ds: MapDataset[T], options: ReadOptions) -> None:
        super().__init__()
        self._ds = ds
        self._len = len(ds)
        self._skip_none = ds._may_be_none
        self._fingerprint = ds.fingerprint
        self._threads = options.num_threads
        self._buffer_size = options.prefetch_buffer_size
        self._buf: list[Any] = []
        self._pos = 0
        self._buf_start = 0  # index of _buf[0]
        self._block = 16
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: collections.deque[tuple[int, int, Any]] = collections.deque()
        self._submitted = 0  # next index to submit to the pool
        self._max_chunk = max(1, min(256, self._buffer_size // max(1, 2 * self._threads)))
        self._chunk = self._max_chunk
        self._element_bytes: float | None = None  # measured on the first chunk
        self._closed = False

    # -- the hot path ----------------------------------------------------------------------

    def __next__(self) -> T:
        while True:
            pos = self._pos
            if pos < len(self._buf):
                self._pos = pos + 1
                x = self._buf[pos]
                if x is None and self._skip_none:
                    continue
                return x
            self._fill()

    def _next_many(self, n: int) -> list[T]:
        out: list[T] = []
        while len(out) < n:
            pos = self._pos
            if pos >= len(self._buf):
                try:
                    self._fill()
                except StopIteration:
                    break
                continue
            take = self._buf[pos : pos + n - len(out)]
            self._pos = pos + len(take)
            if self._skip_none:
                out.extend(x for x in take if x is not None)
            else:
                out.extend(take)
        return out

    def _fill(self) -> None:
        """Replaces the consumed buffer with the next block; StopIteration at the end."""
        start = self._buf_start + len(self._buf)
        if start >= self._len:
            self._buf, self._pos, self._buf_start = [], 0, start
            self._release_pool()  # nothing more to compute: free the threads now
            raise StopIteration
        if self._closed:
            raise RuntimeError("next() on a closed iterator: create a new one with iter(ds).")
        if self._threads:
            items = self._next_chunk_from_pool(start)
        else:
            items = self._compute_block(start)
        self._buf, self._pos, self._buf_start = items, 0, start

    def _compute_block(self, start: int) -> list[Any]:
        k = min(self._block, self._len - start)
        t0 = time.perf_counter()
        items = self._getitems_exact(start, k)
        dt = time.perf_counter() - t0
        if dt < _FAST_BLOCK_S and self._block < _MAX_BLOCK:
            self._block *= 2
        elif dt > _SLOW_BLOCK_S and self._block > _MIN_BLOCK:
            self._block //= 2
        return items

    def _getitems_exact(self, start: int, k: int) -> list[Any]:
        """Elements `[start, start + k)`; an error surfaces at its own element.

        A block that fails is recomputed one element at a time, so the elements before the
        failing one are still handed out and the exception comes when the consumer reaches
        the failing element, exactly as if elements were computed one by one.
        """
        try:
            return self._ds._getitems(np.arange(start, start + k, dtype=np.int64))
        except Exception:
            if k == 1:
                raise
        self._block = 1
        items: list[Any] = []
        for i in range(start, start + k):
            try:
                items.extend(self._ds._getitems(np.array([i], dtype=np.int64)))
            except Exception:
                if not items:
                    raise
                break
        return items

    # -- threads ---------------------------------------------------------------------------

    def _ensure_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self._threads, thread_name_prefix="chute-read"
            )
            weakref.finalize(self, _shutdown, self._executor)
        return self._executor

    def _submit(self, start: int, k: int) -> Any:
        """Starts computing elements `[start, start + k)`; returns a future-like handle."""
        idx = np.arange(start, start + k, dtype=np.int64)
        return self._ensure_pool().submit(self._ds._getitems, idx)

    def _chunk_result(self, start: int, k: int, fut: Any) -> list[Any]:
        if fut.exception() is None:
            items: list[Any] = fut.result()
            if self._element_bytes is None and items:
                self._element_bytes = nbytes(items) / len(items)
            return items
        # Recompute in this thread, one by one, so the error surfaces at its element.
        return self._getitems_exact(start, k)

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
        self._chunk = chunk
        while len(self._pending) < limit and self._submitted < self._len:
            start = self._submitted
            k = min(self._chunk, self._len - start)
            self._pending.append((start, k, self._submit(start, k)))
            self._submitted = start + k

    def _next_chunk_from_pool(self, start: int) -> list[Any]:
        if not self._pending or self._pending[0][0] != start:
            self._discard_pending()
            self._submitted = start
        self._top_up()
        _, k, fut = self._pending.popleft()
        self._top_up()
        return self._chunk_result(start, k, fut)

    def _discard_pending(self) -> None:
        for _, _, fut in self._pending:
            fut.cancel()
        self._pending.clear()

    # -- state and lifecycle ---------------------------------------------------------------

    def _own_state(self) -> dict[str, Any]:
        return {"next_index": self._buf_start + self._pos, "fingerprint": self._fingerprint}

    def _count_at(self, state: Any) -> int | None:
        # Exact unless filtered (None) elements are skipped.
        return None if self._skip_none else int_at(state, "next_index")

    def _restore_own_state(self, state: dict[str, Any], path: str) -> None:
        if state["fingerprint"] != self._fingerprint:
            raise CheckpointError(
                f"{path}['fingerprint'] = {state['fingerprint']!r} does not match this "
                f"pipeline's {self._fingerprint!r}: the state was taken from a different "
                "MapDataset (other stages, seeds, sizes or functions); rebuild the pipeline "
                "as it was when the state was taken."
            )
        index = check_int(
            state,
            "next_index",
            path,
            0,
            min(self._len, MAX_POSITION),
            f"an index of the MapDataset of {self._len} elements, or its end"
            if self._len < INFINITE
            else "an index of the infinite MapDataset",
        )
        self._discard_pending()
        self._buf, self._pos, self._buf_start = [], 0, index
        self._submitted = index

    def start_prefetch(self) -> None:
        if self._threads and not self._closed:
            self._top_up()

    def _release_pool(self) -> None:
        self._discard_pending()
        if self._executor is not None:
            _shutdown(self._executor)
            self._executor = None

    def close(self) -> None:
        self._closed = True
        self._release_pool()

    def map_records(self) -> list[Any]:
        """The statistics records of the MapDataset stages, when they are timed."""
        from chute._src.instrument import map_records

        return map_records(self._ds)

    def buffer_info(self) -> tuple[int, int]:
        """(elements, bytes of numpy arrays) computed ahead of the consumer."""
        from chute._src.stats import nbytes

        ahead = self._buf[self._pos :]
        pending = sum(k for _, k, _ in self._pending)
        return len(ahead) + pending, nbytes(ahead)

    def __repr__(self) -> str:
        return f"PrefetchDatasetIterator(next_index={self._buf_start + self._pos})"


def _shutdown(executor: concurrent.futures.ThreadPoolExecutor) -> None:
    executor.shutdown(wait=False, cancel_futures=True)
