"""`MapDataset.batch`: batch `b` of epoch `e` holds parent elements `[b*size, (b+1)*size)`.

`IterDataset.batch`: full batches of consecutive elements, whatever was filtered before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.core import provenance, tree
from chute._src.core.columns import Columns
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.element_spec import batch_spec
from chute._src.core.errors import add_stage_note
from chute._src.core.iterator import DatasetIterator
from chute._src.core.transforms import as_batch_fn, check_batch_size, describe


class BatchMapDataset(MapDataset[Any]):
    """Fetches all elements of a block of batches in one parent call, then stacks each.

    Filtered (None) elements are left out of their batch, so such a batch is smaller; a
    batch whose elements were all filtered reads as None. For full batches after a filter,
    batch after `to_iter_dataset()` instead.
    """

    def __init__(
        self,
        parent: MapDataset[Any],
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__([parent])
        self._size = check_batch_size(batch_size, "batch")
        self._drop = bool(drop_remainder)
        self._batch_fn = as_batch_fn(batch_fn)
        n = self._parent_len = len(parent)
        if n >= INFINITE:
            self._len = INFINITE // self._size
        else:
            self._len = n // self._size if self._drop else -(-n // self._size)

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        size, n, nb = self._size, self._parent_len, self._len
        if nb == 0:
            raise IndexError(f"{self!r} is empty: there is no element {int(indices[0])} to read")
        epochs, b = np.divmod(indices, nb) if n < INFINITE else (np.zeros_like(indices), indices)
        starts = b * size
        counts = np.minimum(size, n - starts) if n < INFINITE else np.full_like(starts, size)
        offsets = starts + epochs * n if n < INFINITE else starts
        if bool((counts == size).all()):
            flat = (offsets[:, None] + np.arange(size)).ravel()
        else:
            flat = np.concatenate([np.arange(o, o + c) for o, c in zip(offsets, counts)])
        xs = self._parents[0]._getitems(flat)
        batch_fn = self._batch_fn
        out: list[Any] = []
        pos = 0
        try:
            for c in counts.tolist():
                group = xs[pos : pos + c]
                pos += c
                if self._may_be_none:
                    group = [x for x in group if x is not None]
                out.append(batch_fn(group) if group else None)
        except Exception as e:
            add_stage_note(e, self, int(indices[len(out)]))
            raise
        return out

    def __repr__(self) -> str:
        extra = "" if self._batch_fn is tree.stack else f", batch_fn={describe(self._batch_fn)}"
        return f"BatchMapDataset(batch_size={self._size}, drop_remainder={self._drop}{extra})"

    def _fingerprint_params(self) -> str:
        return f"batch_size={self._size}, drop_remainder={self._drop}"

    @property
    def _element_spec(self) -> Any:
        return batch_spec(self, self._size, self._drop, self._batch_fn, tree.stack)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's elements of batch `position` (epoch by epoch, as read), each with
        its row; a filtered element leaves its batch, so the rows after it move up."""
        size, n, nb = self._size, self._parent_len, self._len
        if nb == 0:
            raise provenance.EndOfStream
        epoch, b = divmod(position, nb) if n < INFINITE else (0, position)
        start = b * size
        count = min(size, n - start) if n < INFINITE else size
        first = start + epoch * n if n < INFINITE else start
        parent = self._parents[0]
        kept = [
            i
            for i in range(first, first + count)
            if not self._may_be_none or provenance.records_of(parent, i, tracer)
        ]
        return [provenance.Origin(0, i, (row,)) for row, i in enumerate(kept)]


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

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _BatchIterator(self._parent_iter(), self)

    def enable_shared_memory_output(self) -> None:
        """Grain's switch to stack batches into shared memory. chute always does where it
        pays: a batch stacked in a worker process goes to the worker's shared-memory slab
        when large (`core/outbuf.py`); in this process there is no one to share it with.
        So there is nothing to switch on; the call is accepted."""

    def __repr__(self) -> str:
        extra = "" if self._batch_fn is tree.stack else f", batch_fn={describe(self._batch_fn)}"
        return f"BatchIterDataset(batch_size={self._size}, drop_remainder={self._drop}{extra})"

    def _fingerprint_params(self) -> str:
        return f"batch_size={self._size}, drop_remainder={self._drop}"

    @property
    def _element_spec(self) -> Any:
        return batch_spec(self, self._size, self._drop, self._batch_fn, tree.stack)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """Batch `position` holds the parent's steps from `position * batch_size`: as many
        as there are (all of them with `drop_remainder`)."""
        start = position * self._size
        parent = self._parents[0]
        if not tracer.exists(parent, start):
            raise provenance.EndOfStream
        out = []
        for row in range(self._size):
            if row and not tracer.exists(parent, start + row):
                if self._drop:
                    raise provenance.EndOfStream
                break
            out.append(provenance.Origin(0, start + row, (row,)))
        return out


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
        # Stacking leaf by leaf: elements that come as columns (from worker processes) are
        # cut and joined as columns, not stacked one by one (`core/columns.py`).
        self._take = parent._next_columns if ds._batch_fn is tree.stack else parent._next_many

    def __next__(self) -> Any:
        xs = self._take(self._size)
        if not xs or (self._drop and len(xs) < self._size):
            raise StopIteration
        if isinstance(xs, Columns):
            self._batches += 1
            return xs.stacked()
        try:
            batch = self._batch_fn(xs)
        except Exception as e:
            add_stage_note(e, self._ds, self._batches)
            raise
        self._batches += 1
        return batch
