"""`IterDataset.filter`.

`MapDataset.filter`: rejected elements read as None and are skipped when iterating.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from chute._src.core import provenance
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.errors import add_stage_note
from chute._src.core.iterator import DatasetIterator
from chute._src.core.transforms import FilterTransform, as_filter_fn, describe
from chute._src.ops.block_apply import failed_position
from chute._src.ops.filter_check import CHECK_INTERVAL, SkipCounter

T = TypeVar("T")


class FilterIterDataset(IterDataset[T]):
    _keeps_element_spec = True  # its elements are its first parent's
    _role = StageRole.ELEMENT_WISE
    _stage_name = "filter"  # what its iterator records in states

    def __init__(self, parent: IterDataset[T], predicate: Any) -> None:
        super().__init__([parent])
        self._fn: Callable[[Any], bool] = as_filter_fn(predicate)

    def _as_map_stage(self, parent: MapDataset[Any]) -> MapDataset[Any]:
        moved = parent.filter(self._fn)
        vars(moved)["_moved_from"] = repr(self)  # what errors name it by (`pipeline_pickle.py`)
        return moved

    def _make_iterator(self) -> DatasetIterator[T]:
        return _FilterIterator(self._parent_iter(), self)

    def __repr__(self) -> str:
        return f"FilterIterDataset(transform={describe(self._fn)})"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's step of the `position`-th kept element: the predicate runs on the
        parent's elements up to it (computed once per `provenance` call)."""
        memo = tracer.memo(self)
        kept: list[int] = memo.setdefault("kept", [])
        stream = tracer.stream(self._parents[0])
        while len(kept) <= position:
            j = memo.get("next", 0)
            x = stream.get(j)  # EndOfStream past the parent's end
            memo["next"] = j + 1
            if self._fn(x):
                kept.append(j)
        return provenance.same_position(kept[position])


def _name(fn: Any) -> str:
    """The filter as Grain names it in its warning: a `FilterTransform` by its class."""
    owner = getattr(fn, "__self__", None)
    return type(owner).__name__ if isinstance(owner, FilterTransform) else describe(fn)


class _FilterIterator(DatasetIterator[T]):
    stage = "filter"

    def __init__(self, parent: DatasetIterator[T], ds: FilterIterDataset[T]) -> None:
        super().__init__(parent)
        self._fn = ds._fn
        self._ds = ds
        self._seen = 0  # elements tested, to name the failing one
        self._dropped = 0
        self._check_at = CHECK_INTERVAL  # when `_seen` reaches it, the counter looks
        self._counter = SkipCounter(ds, shown=f"FilterDatasetIterator(transform={_name(ds._fn)})")

    def __next__(self) -> T:
        parent, fn = self._parent, self._fn
        while True:
            x = next(parent)
            try:
                keep = fn(x)
            except Exception as e:
                add_stage_note(e, self._ds, self._seen)
                raise
            self._seen += 1
            if keep:
                return x
            self._dropped += 1  # only a dropping filter can warn: kept elements cost nothing
            if self._seen >= self._check_at:
                self._look()

    def _look(self) -> None:
        self._counter.update(self._seen, self._dropped)
        self._check_at = self._seen + CHECK_INTERVAL

    def _next_many(self, n: int) -> list[T]:
        out: list[T] = []
        fn = self._fn
        while len(out) < n:
            xs = self._parent._next_many(n - len(out))
            if not xs:
                break
            kept = 0
            for j, x in enumerate(xs):
                try:
                    keep = fn(x)
                except Exception as e:
                    add_stage_note(e, self._ds, self._seen + j)
                    raise
                if keep:
                    out.append(x)
                    kept += 1
            self._seen += len(xs)
            self._dropped += len(xs) - kept
            if self._seen >= self._check_at:
                self._look()
        return out


class FilterMapDataset(MapDataset[T]):
    """Element `i` is the parent's element `i` if `predicate` keeps it, else None."""

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, parent: MapDataset[T], predicate: Any) -> None:
        super().__init__([parent])
        self._fn: Callable[[Any], bool] = as_filter_fn(predicate)
        self._may_be_none = True

    def __len__(self) -> int:
        return len(self._parents[0])

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        xs = self._parents[0]._getitems(indices)
        fn = self._fn
        it = iter(xs)
        try:
            return [x if x is not None and fn(x) else None for x in it]
        except Exception as e:
            add_stage_note(e, self, int(indices[failed_position(it, len(xs))]))
            raise

    def __repr__(self) -> str:
        return f"FilterMapDataset(transform={describe(self._fn)})"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's element, if the predicate keeps it: the predicate runs on the
        parent's element (and nothing above this stage runs)."""
        x = tracer.element(self._parents[0], position)
        return provenance.same_position(position) if x is not None and self._fn(x) else []
