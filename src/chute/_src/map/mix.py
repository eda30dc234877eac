"""`MapDataset.mix` and `MapDataset.select_from_datasets`: random access into a mixture."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.dataset import INFINITE, MapDataset
from chute._src.mixing import Schedule, int_proportions


def check_parents(datasets: Any, where: str) -> list[MapDataset[Any]]:
    parents = list(datasets)
    if not parents or not all(isinstance(d, MapDataset) for d in parents):
        raise TypeError(
            f"{where}: datasets={datasets!r} is invalid: pass a non-empty list of "
            "MapDatasets (use IterDataset.mix for IterDatasets)."
        )
    return parents


def gather(parents: Sequence[MapDataset[Any]], which: np.ndarray, keys: np.ndarray) -> list[Any]:
    """Elements `parents[which[j]][keys[j]]`, one `_getitems` call per parent."""
    out: list[Any] = [None] * len(which)
    for i in np.unique(which).tolist():
        sel = np.flatnonzero(which == i)
        for j, x in zip(sel.tolist(), parents[i]._getitems(keys[sel])):
            out[j] = x
    return out


class MixedMapDataset(MapDataset[Any]):
    """Interleaves datasets in the proportions of `weights`, deterministically.

    The mixture ends when its first dataset runs out (repeat the inputs first for an
    infinite mixture); shuffle the inputs first to shuffle it.

    >>> import chute
    >>> ds = chute.MapDataset.mix([chute.MapDataset.range(5), chute.MapDataset.range(7, 10)])
    >>> list(ds)
    [0, 7, 1, 8, 2, 9]
    >>> mixed = chute.MapDataset.mix(
    ...     [chute.MapDataset.range(100), chute.MapDataset.range(100, 200)], [3, 1])
    >>> sum(x >= 100 for x in mixed[:40])
    10
    """

    def __init__(
        self, datasets: Sequence[MapDataset[Any]], weights: Sequence[float] | None
    ) -> None:
        parents = check_parents(datasets, "MapDataset.mix")
        super().__init__(parents)
        props = int_proportions(weights, len(parents), "MapDataset.mix")
        self._schedule = Schedule(props, "MapDataset.mix")
        total = sum(props)
        lengths = [len(p) for p in parents]
        empty = [i for i, n in enumerate(lengths) if n == 0]
        if empty:
            raise ValueError(
                f"MapDataset.mix: datasets {empty} are empty: every mixed dataset needs "
                "elements; leave empty ones out."
            )
        self._len = min(INFINITE, int(min(n / (p / total) for n, p in zip(lengths, props))))

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        which, keys = self._schedule.locate(indices)
        return gather(self._parents, which, keys)

    def __repr__(self) -> str:
        return f"MixedMapDataset(proportions={list(self._schedule.proportions)})"

    def _fingerprint_params(self) -> str:
        return str(self._schedule.proportions)


class SelectFromDatasetsMapDataset(MapDataset[Any]):
    """Element `k` is `datasets[d][i]` where `(d, i) = selection_map[k]`; index
    `k + e * len(selection_map)` reads epoch `e` of `datasets[d]` there.

    >>> import chute
    >>> pick = [(1, 0), (0, 2), (1, 1)]
    >>> ds = chute.MapDataset.select_from_datasets(
    ...     [chute.MapDataset.range(3), chute.MapDataset.range(10, 12)], pick)
    >>> list(ds)
    [10, 2, 11]
    """

    def __init__(self, datasets: Sequence[MapDataset[Any]], selection_map: Any) -> None:
        parents = check_parents(datasets, "MapDataset.select_from_datasets")
        super().__init__(parents)
        if not (hasattr(selection_map, "__len__") and hasattr(selection_map, "__getitem__")):
            raise TypeError(
                f"MapDataset.select_from_datasets: selection_map={selection_map!r} is invalid: "
                "it must have __len__ and __getitem__(k) -> (dataset index, element index)."
            )
        self._map = selection_map
        self._len = len(selection_map)

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        if self._len == 0:
            raise IndexError(f"{self!r} is empty: there is no element {int(indices[0])} to read")
        epochs, pos = np.divmod(indices, self._len)
        pairs = [self._map[k] for k in pos.tolist()]
        n = len(self._parents)
        for k, (d, _) in zip(pos.tolist(), pairs):
            if not 0 <= d < n:
                raise IndexError(
                    f"select_from_datasets: selection_map[{k}] names dataset {d}, but there "
                    f"are {n}: dataset indices must be in [0, {n})."
                )
        which = np.fromiter((d for d, _ in pairs), dtype=np.int64, count=len(pairs))
        keys = np.fromiter((i for _, i in pairs), dtype=np.int64, count=len(pairs))
        if int(epochs.max()) > 0:  # epoch e reads epoch e of the selected datasets
            sizes = np.array([len(p) for p in self._parents], dtype=np.int64)
            keys = np.asarray(keys + epochs * sizes[which], dtype=np.int64)
        return gather(self._parents, which, keys)

    def __repr__(self) -> str:
        return f"SelectFromDatasetsMapDataset(selection_map={type(self._map).__name__})"

    def _fingerprint_params(self) -> str:
        return f"{type(self._map).__name__}, len={self._len}"
