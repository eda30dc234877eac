"""Computing ahead of the consumer in a background thread.

- `IterDataset.prefetch(n)`: what `ds.prefetch(...)` means to a tf.data or a Grain user
  (`prefetch` below).
- `experimental.ThreadPrefetchIterDataset` (and `ThreadPrefetchDatasetIterator`, the same
  over any iterator with `get_state`/`set_state`): one stage computed ahead in a thread.
- `experimental.multithread_prefetch`: a whole pipeline computed ahead on threads.

A background thread runs the parent iterator and keeps up to `prefetch_buffer_size`
elements ready, so a training step overlaps with producing the next batch (in the text
pipeline, the share of time spent waiting for data falls from 46% to ~1.6%). With each
element the thread records the parent's state right after producing it; `get_state`
returns the state recorded with the last element handed out, so a checkpoint is exact
whatever is buffered.

It is one daemon thread of its own, not `threadpool.ComputePool`'s: the parent is one
iterator, whose elements come one after another (each from the state the last left), so
more threads would have nothing to compute; a loop filling a bounded queue hands over an
element for one queue put, where a pool would cost a future per element.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, TypeVar

from chute._src.core import contract
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, rewrite
from chute._src.core.iterator import DatasetIterator
from chute._src.core.options import MultiprocessingOptions, ReadOptions
from chute._src.core.tuning import is_autotune
from chute._src.exec.executors import nbytes

T = TypeVar("T")

_END = object()

AUTOTUNE_BUFFER = 2
"""The buffer of `prefetch(chute.AUTOTUNE)`, in elements."""


def prefetch(ds: IterDataset[T], buffer: Any) -> IterDataset[T]:
    """`ds` prefetched as `buffer` says.

    tf.data's `ds.prefetch(tf.data.AUTOTUNE)` (or `prefetch(8)`) computes elements in the
    background ahead of the consumer; Grain's older `IterDataset.prefetch(options)` starts
    worker processes. `prefetch` accepts both habits: `MultiprocessingOptions` give
    `mp_prefetch`; an int `n` gives a `ThreadPrefetchIterDataset` with a buffer of `n`
    elements (0: none); `chute.AUTOTUNE` gives the same with `AUTOTUNE_BUFFER` elements,
    tf.data's usual outcome for a final `prefetch` (one element being consumed, one
    ready): the thread overlaps the pipeline with the step. The size is not tuned at run
    time; give an int for another. Anything else raises, naming both stages.

    >>> import chute
    >>> ds = chute.MapDataset.range(4).to_iter_dataset().batch(2).prefetch(chute.AUTOTUNE)
    >>> [b.tolist() for b in ds]
    [[0, 1], [2, 3]]
    """
    if isinstance(buffer, MultiprocessingOptions):
        return ds.mp_prefetch(buffer)
    if is_autotune(buffer):
        return ThreadPrefetchIterDataset(ds, prefetch_buffer_size=AUTOTUNE_BUFFER)
    if isinstance(buffer, int) and not isinstance(buffer, bool) and buffer >= 0:
        return ThreadPrefetchIterDataset(ds, prefetch_buffer_size=buffer)
    raise TypeError(
        f"IterDataset.prefetch({buffer!r}) is invalid: pass chute.AUTOTUNE or an int >= 0 "
        "(elements computed ahead in a background thread, as tf.data's prefetch: "
        "chute.experimental.ThreadPrefetchIterDataset), or MultiprocessingOptions (worker "
        "processes, as Grain's prefetch: ds.mp_prefetch(chute.MultiprocessingOptions(...)))."
    )


class ThreadPrefetchIterDataset(IterDataset[T]):
    """Prefetches `prefetch_buffer_size` elements of `parent` in a background thread.

    >>> import chute
    >>> ds = chute.experimental.ThreadPrefetchIterDataset(
    ...     chute.MapDataset.range(5).to_iter_dataset(), prefetch_buffer_size=2)
    >>> list(ds)
    [0, 1, 2, 3, 4]
    """

    def __init__(self, parent: IterDataset[T], *, prefetch_buffer_size: int) -> None:
        super().__init__([parent])
        if not isinstance(parent, IterDataset):
            raise TypeError(
                f"ThreadPrefetchIterDataset: parent {parent!r} is not an IterDataset: call "
                ".to_iter_dataset() on a MapDataset first."
            )
        if (
            isinstance(prefetch_buffer_size, bool)
            or not isinstance(prefetch_buffer_size, int)
            or prefetch_buffer_size < 0
        ):
            raise ValueError(
                f"ThreadPrefetchIterDataset: prefetch_buffer_size={prefetch_buffer_size!r} is "
                "invalid: it must be an int >= 0 (0 disables prefetching). (In Grain's words: "
                "`prefetch_buffer_size` must be greater than or equal to 0.)"
            )
        self._size = prefetch_buffer_size

    @property
    def _role(self) -> StageRole:  # type: ignore[override]
        return StageRole.PREFETCH if self._size else StageRole.PASS_THROUGH

    @property
    def _concurrent(self) -> bool:
        return self._size > 0

    def _make_iterator(self) -> DatasetIterator[T]:
        return prefetch_iterator(self._parent_iter(), self._size)

    def __repr__(self) -> str:
        return f"ThreadPrefetchIterDataset(prefetch_buffer_size={self._size})"


def prefetch_iterator(parent: DatasetIterator[T], size: int) -> DatasetIterator[T]:
    """`parent` computed `size` elements ahead in a background thread (0: on demand, in the
    consumer's thread). Transparent: its state is `parent`'s after the last element out."""
    if size == 0:
        return _Unbuffered(parent)
    return _ThreadPrefetchIterator(parent, size)


class _Unbuffered(DatasetIterator[Any]):
    stage = "thread_prefetch"
    transparent = True

    def __next__(self) -> Any:
        return next(self._parent)

    def _next_many(self, n: int) -> list[Any]:
        return self._parent._next_many(n)


class _Producer:
    """The background thread's side. Holds no reference to the consumer-side iterator,
    so that dropping the iterator lets the finalizer stop the thread."""

    def __init__(self, parent: DatasetIterator[Any], size: int) -> None:
        self.parent = parent
        self.queue: queue.Queue[tuple[Any, Any]] = queue.Queue(maxsize=size)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="chute-prefetch", daemon=True)

    def run(self) -> None:
        parent, q, stop = self.parent, self.queue, self.stop
        while not stop.is_set():
            try:
                item: tuple[Any, Any] = (next(parent), parent.get_state())
            except StopIteration:
                item = (_END, None)
            except BaseException as e:  # delivered to the consumer at this position
                item = (_END, e)
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[0] is _END:
                return

    def halt(self, wait: bool = True) -> None:
        """Stops the thread after the element it is computing; `wait`: until then."""
        self.stop.set()
        if wait and self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()

    def abandon(self) -> None:
        """For an iterator dropped without `close()`: the thread stops after the element
        it is computing, on its own. Not waited for: that element may never come (a
        filter that drops everything of an endless stream), and the consumer is gone."""
        self.halt(wait=False)


class _ThreadPrefetchIterator(DatasetIterator[Any]):
    stage = "thread_prefetch"
    transparent = True  # its state is its parent's after the last element handed out

    def __init__(self, parent: DatasetIterator[Any], size: int) -> None:
        super().__init__(parent)
        self._size = size
        self._producer: _Producer | None = None
        self._state: dict[str, Any] | None = None  # parent state after the last element out
        self._done = False

    def _start(self) -> _Producer:
        if self._producer is None:
            if self._state is None:
                self._state = self._parent.get_state()
            producer = _Producer(self._parent, self._size)
            weakref.finalize(self, producer.abandon)
            producer.thread.start()
            self._producer = producer
        return self._producer

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        element, state = self._start().queue.get()
        if element is _END:
            self._done = True
            self._stop_producer()
            if state is not None:
                raise state
            raise StopIteration
        self._state = state
        return element

    def start_prefetch(self) -> None:
        if not self._done:
            self._start()

    def _stop_producer(self) -> None:
        if self._producer is not None:
            self._producer.halt()
            self._producer = None

    def get_state(self) -> dict[str, Any]:
        return self._state if self._state is not None else self._parent.get_state()

    def _restore(self, state: Any, path: str) -> None:
        self._stop_producer()
        super()._restore(state, path)
        self._state = None
        self._done = False

    def close(self) -> None:
        self._stop_producer()
        self._done = True
        self._parent.close()

    def buffer_info(self) -> tuple[int, int]:
        """(elements, bytes of numpy arrays) produced ahead of the consumer."""
        if self._producer is None:
            return 0, 0
        queued = [element for element, _ in list(self._producer.queue.queue)]
        return len(queued), nbytes(queued)


def multithread_prefetch(
    ds: IterDataset[T], num_threads: int, buffer_size: int, sequential_slice: bool = False
) -> IterDataset[T]:
    """`ds` computed ahead on `num_threads` threads (0: `ds` itself), in the same order
    for any number of threads. With `sequential_slice=True` the order is Grain's for that
    many threads: each reads a contiguous share of the data, and their outputs are taken
    in turn (`sequential_slice.py`).

    >>> import chute
    >>> ds = chute.MapDataset.range(8).to_iter_dataset().map(lambda x: x * 2)
    >>> list(multithread_prefetch(ds, num_threads=3, buffer_size=2))
    [0, 2, 4, 6, 8, 10, 12, 14]
    """
    for name, value in (("num_threads", num_threads), ("buffer_size", buffer_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"multithread_prefetch: {name}={value!r} is invalid: it must be an int >= 0."
            )
    if num_threads == 0:
        return ds
    if not isinstance(sequential_slice, bool):
        raise TypeError(
            f"multithread_prefetch: sequential_slice={sequential_slice!r} is not a bool: pass "
            "True or False."
        )
    if sequential_slice and num_threads > 1:
        from chute._src.exec.sequential_slice import sequential_shares  # imports ops

        ds = sequential_shares(ds, num_threads, "multithread_prefetch")
    options = ReadOptions(
        num_threads=num_threads, prefetch_buffer_size=num_threads * max(1, buffer_size)
    )

    def threaded(node: Any) -> Any:
        if contract.role(node) is StageRole.READER and node.parents:
            return node.parents[0].to_iter_dataset(options)
        return node

    return ThreadPrefetchIterDataset(
        rewrite(ds, threaded), prefetch_buffer_size=max(1, buffer_size)
    )


class ThreadPrefetchDatasetIterator(_ThreadPrefetchIterator):
    """An iterator computing `parent` ahead in a background thread, `prefetch_buffer_size`
    elements at most; its state is `parent`'s after the last element handed out.

    `parent` may be any iterator with `get_state()` and `set_state(state)`, as in Grain,
    not only a `DatasetIterator`.
    """

    def __init__(self, parent: Any, prefetch_buffer_size: int) -> None:
        if not isinstance(parent, DatasetIterator):
            parent = _StatefulIterator(parent)
        super().__init__(parent, prefetch_buffer_size)


class _StatefulIterator(DatasetIterator[Any]):
    """A plain iterator with `get_state()`/`set_state()`, read as a `DatasetIterator`."""

    stage = "iterator"

    def __init__(self, it: Any) -> None:
        missing = [m for m in ("__next__", "get_state", "set_state") if not hasattr(it, m)]
        if missing:
            raise TypeError(
                f"ThreadPrefetchDatasetIterator: parent {it!r} of type {type(it).__name__} "
                f"lacks {missing}: prefetching needs an iterator whose position can be saved "
                "and restored (get_state()/set_state(state)), such as iter(ds) of a dataset."
            )
        super().__init__()
        self._it = it

    def __next__(self) -> Any:
        return next(self._it)

    def get_state(self) -> Any:
        return self._it.get_state()

    def set_state(self, state: Any) -> None:  # the iterator's own state, of its own shape
        self._it.set_state(state)

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return repr(self._it)
