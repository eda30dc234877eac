"""`experimental.multithread_prefetch`: a pipeline computed ahead on threads.

Every `to_iter_dataset` reader of the pipeline computes its chunks on `num_threads`
threads, and the stages after the readers run in one more background thread, with up to
`buffer_size` elements ready. The output is the same for any number of threads.
"""

from __future__ import annotations

from typing import Any, TypeVar

from chute._src.core import contract
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, rewrite
from chute._src.core.iterator import DatasetIterator
from chute._src.core.options import ReadOptions
from chute._src.exec.sequential_slice import sequential_shares
from chute._src.exec.thread_prefetch import ThreadPrefetchIterDataset, _ThreadPrefetchIterator

T = TypeVar("T")


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
