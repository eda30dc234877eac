"""`IterDataset.batch`: full batches of consecutive elements, whatever was filtered before."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chute._src import tree
from chute._src.dataset import IterDataset
from chute._src.errors import add_stage_note
from chute._src.iterator import DatasetIterator
from chute._src.transforms import as_batch_fn, check_batch_size, describe


class BatchIterDataset(IterDataset[Any]):
    def __init__(
        self,
        parent: IterDataset[Any],
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__([parent])
        self._size = check_batch_size(batch_size, "batch")
        self._drop = bool(drop_remainder)
        self._batch_fn = as_batch_fn(batch_fn)

    def make_iterator(self) -> DatasetIterator[Any]:
        return _BatchIterator(self._parent_iter(), self)

    def __repr__(self) -> str:
        extra = "" if self._batch_fn is tree.stack else f", batch_fn={describe(self._batch_fn)}"
        return f"BatchIterDataset(batch_size={self._size}, drop_remainder={self._drop}{extra})"

    def _fingerprint_params(self) -> str:
        return f"batch_size={self._size}, drop_remainder={self._drop}"


class _BatchIterator(DatasetIterator[Any]):
    """Pulls a whole batch from its parent at once, so it holds no partial batch in its state."""

    stage = "batch"

    def __init__(self, parent: DatasetIterator[Any], ds: BatchIterDataset) -> None:
        super().__init__(parent)
        self._ds = ds
        self._size = ds._size
        self._drop = ds._drop
        self._batch_fn = ds._batch_fn
        self._batches = 0

    def __next__(self) -> Any:
        xs = self._parent._next_many(self._size)
        if not xs or (self._drop and len(xs) < self._size):
            raise StopIteration
        try:
            batch = self._batch_fn(xs)
        except Exception as e:
            add_stage_note(e, self._ds, self._batches)
            raise
        self._batches += 1
        return batch
