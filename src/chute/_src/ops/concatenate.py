"""`MapDataset.concatenate`: the elements of several datasets one after another."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core import provenance
from chute._src.core.dataset import INFINITE, MapDataset
from chute._src.ops.mix import check_parents, gather


class ConcatenateMapDataset(MapDataset[Any]):
    """All of `datasets[0]`, then all of `datasets[1]`, ...; epoch `e` reads their epoch `e`.

    >>> import chute
    >>> ds = chute.MapDataset.concatenate([chute.MapDataset.range(3), chute.MapDataset.range(3, 8)])
    >>> list(ds), ds[9]
    ([0, 1, 2, 3, 4, 5, 6, 7], 1)
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, datasets: Sequence[MapDataset[Any]]) -> None:
        parents = check_parents(datasets, "MapDataset.concatenate")
        super().__init__(parents)
        self._sizes = np.array([len(p) for p in parents], dtype=np.int64)
        for p, n in zip(parents, self._sizes.tolist()):
            if n >= INFINITE:
                raise ValueError(
                    f"MapDataset.concatenate: {p!r} is infinite: only finite datasets can be "
                    "concatenated; repeat the concatenation instead of its inputs."
                )
        self._ends = np.cumsum(self._sizes)
        self._len = int(self._ends[-1])

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        if self._len == 0:
            raise IndexError(f"{self!r} is empty: there is no element {int(indices[0])} to read")
        epochs, pos = np.divmod(indices, self._len)
        which = np.searchsorted(self._ends, pos, side="right")
        keys = pos - (self._ends[which] - self._sizes[which]) + epochs * self._sizes[which]
        return gather(self._parents, which, keys)

    def __repr__(self) -> str:
        return f"ConcatenateMapDataset(sizes={self._sizes.tolist()})"

    def _fingerprint_params(self) -> str:
        return f"sizes={self._sizes.tolist()}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The dataset and position read, shown as the dataset's number."""
        if self._len == 0:
            raise provenance.EndOfStream
        epoch, pos = divmod(position, self._len)
        which = int(np.searchsorted(self._ends, pos, side="right"))
        size = int(self._sizes[which])
        key = pos - (int(self._ends[which]) - size) + epoch * size
        return [provenance.Origin(which, key, source=which)]
