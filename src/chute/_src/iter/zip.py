"""`experimental.ZipIterDataset`: tuples of the next element of every stream."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chute._src.dataset import IterDataset
from chute._src.iterator import DatasetIterator


class ZipIterDataset(IterDataset[tuple[Any, ...]]):
    """`(next(a), next(b), ...)` until the shortest stream ends.

    >>> import chute
    >>> a = chute.MapDataset.range(3).to_iter_dataset()
    >>> b = chute.MapDataset.range(10, 20).to_iter_dataset().filter(lambda x: x % 2)
    >>> list(chute.experimental.ZipIterDataset([a, b]))
    [(0, 11), (1, 13), (2, 15)]
    """

    def __init__(self, parents: Sequence[IterDataset[Any]]) -> None:
        ps = list(parents)
        if not ps or not all(isinstance(p, IterDataset) for p in ps):
            raise TypeError(
                f"ZipIterDataset: parents={parents!r} is invalid: pass a non-empty list of "
                "IterDatasets."
            )
        super().__init__(ps)

    def make_iterator(self) -> DatasetIterator[tuple[Any, ...]]:
        return _ZipIterator([self._parent_iter(i) for i in range(len(self._parents))])

    def __repr__(self) -> str:
        return f"ZipIterDataset({len(self._parents)} parents)"


class _ZipIterator(DatasetIterator[tuple[Any, ...]]):
    """Its state is the default of several parents: `{"stage": "zip", "parents": [...]}`."""

    stage = "zip"

    def __init__(self, parents: list[DatasetIterator[Any]]) -> None:
        super().__init__(parents)
        self._parents = parents

    def __next__(self) -> tuple[Any, ...]:
        row = []
        for p in self._parents:
            row.append(next(p))
        return tuple(row)

    def _next_many(self, n: int) -> list[tuple[Any, ...]]:
        columns = [p._next_many(n) for p in self._parents]
        return list(zip(*columns))
