"""`MapDataset.filter`: rejected elements read as None and are skipped when iterating."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from chute._src.dataset import MapDataset
from chute._src.errors import add_stage_note
from chute._src.map._apply import failed_position
from chute._src.transforms import as_filter_fn, describe

T = TypeVar("T")


class FilterMapDataset(MapDataset[T]):
    """Element `i` is the parent's element `i` if `predicate` keeps it, else None."""

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
