"""`experimental.ZipMapDataset`: tuples of the elements at the same index."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.dataset import MapDataset
from chute._src.map.mix import check_parents


class ZipMapDataset(MapDataset[tuple[Any, ...]]):
    """Element `i` is `(datasets[0][i], datasets[1][i], ...)`; as long as the shortest.

    >>> import chute
    >>> ds = chute.experimental.ZipMapDataset([chute.MapDataset.range(3), chute.MapDataset.range(10, 20)])
    >>> list(ds)
    [(0, 10), (1, 11), (2, 12)]
    """

    def __init__(self, parents: Sequence[MapDataset[Any]]) -> None:
        ps = check_parents(parents, "ZipMapDataset")
        super().__init__(ps)
        self._len = min(len(p) for p in ps)
        self._lens = [len(p) for p in ps]

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        if self._len == 0:
            raise IndexError(f"{self!r} is empty: there is no element {int(indices[0])} to read")
        epochs, pos = np.divmod(indices, self._len)
        columns = [p._getitems(epochs * n + pos) for p, n in zip(self._parents, self._lens)]
        return [None if any(x is None for x in row) else row for row in zip(*columns)]

    def __repr__(self) -> str:
        return f"ZipMapDataset({len(self._parents)} parents)"
