"""`MapDataset.map` and `.map_with_index` (`.random_map`: `random_map.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.dataset import MapDataset
from chute._src.errors import add_stage_note
from chute._src.map._apply import failed_position
from chute._src.transforms import (
    as_map_fn,
    as_map_with_index_fn,
    describe,
)


class MapMapDataset(MapDataset[Any]):
    """Applies a function to each element of a block; filtered (None) elements stay None."""

    def __init__(self, parent: MapDataset[Any], transform: Any) -> None:
        super().__init__([parent])
        self._fn: Callable[[Any], Any] = as_map_fn(transform, "map")

    def __len__(self) -> int:
        return len(self._parents[0])

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        xs = self._parents[0]._getitems(indices)
        fn = self._fn
        it = iter(xs)
        try:
            if self._may_be_none:
                return [None if x is None else fn(x) for x in it]
            return list(map(fn, it))
        except Exception as e:
            add_stage_note(e, self, int(indices[failed_position(it, len(xs))]))
            raise

    def __repr__(self) -> str:
        return f"MapMapDataset(transform={describe(self._fn)})"


class MapWithIndexMapDataset(MapDataset[Any]):
    """Applies `fn(index, element)`; the index counts epochs too (`i + epoch * len`)."""

    def __init__(self, parent: MapDataset[Any], transform: Any) -> None:
        super().__init__([parent])
        self._fn: Callable[[int, Any], Any] = as_map_with_index_fn(transform)

    def __len__(self) -> int:
        return len(self._parents[0])

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        xs = self._parents[0]._getitems(indices)
        fn = self._fn
        it = iter(xs)
        try:
            return [None if x is None else fn(i, x) for x, i in zip(it, indices.tolist())]
        except Exception as e:
            add_stage_note(e, self, int(indices[failed_position(it, len(xs))]))
            raise

    def __repr__(self) -> str:
        return f"MapWithIndexMapDataset(transform={describe(self._fn)})"
