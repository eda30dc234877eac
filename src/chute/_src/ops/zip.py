"""`experimental.ZipIterDataset`: tuples of the next element of every stream.

`experimental.ZipMapDataset`: tuples of the elements at the same index.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core import provenance
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.element_spec import parent_spec
from chute._src.core.iterator import DatasetIterator
from chute._src.ops.mix import check_parents


class ZipIterDataset(IterDataset[tuple[Any, ...]]):
    """`(next(a), next(b), ...)`; as Grain (and `zip(..., strict=True)`), streams of
    different lengths raise `ValueError` when the shortest ends, unless `strict=False`,
    which stops there.

    >>> import chute
    >>> a = chute.MapDataset.range(3).to_iter_dataset()
    >>> b = chute.MapDataset.range(10, 20).to_iter_dataset().filter(lambda x: x % 2)
    >>> list(chute.experimental.ZipIterDataset([a, b], strict=False))
    [(0, 11), (1, 13), (2, 15)]
    >>> list(chute.experimental.ZipIterDataset([a, b]))
    Traceback (most recent call last):
    ...
    ValueError: ZipIterDataset argument 2 is longer than argument 1
    """

    def __init__(self, parents: Sequence[IterDataset[Any]], *, strict: bool = True) -> None:
        ps = list(parents)
        if not ps or not all(isinstance(p, IterDataset) for p in ps):
            raise TypeError(
                f"ZipIterDataset: parents={parents!r} is invalid: pass a non-empty list of "
                "IterDatasets."
            )
        super().__init__(ps)
        self._strict = bool(strict)

    def _make_iterator(self) -> DatasetIterator[tuple[Any, ...]]:
        return _ZipIterator([self._parent_iter(i) for i in range(len(self._parents))], self._strict)

    def __repr__(self) -> str:
        return f"ZipIterDataset({len(self._parents)} parents, strict={self._strict})"

    @property
    def _element_spec(self) -> Any:
        return tuple(parent_spec(p) for p in self._parents)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """One element of each parent, at the same position; a tuple's part `i` has offset
        `(i,)`. Where a parent has ended: the end of the zip, or with `strict` and streams
        of other lengths, the `ValueError` the run raises there (the ended parents' lengths
        are found as `repeat` finds them, O(log n) asks each)."""
        parents = self._parents
        ended = [not tracer.exists(parent, position) for parent in parents]
        if not any(ended):
            return [provenance.Origin(i, position, (i,), source=i) for i in range(len(parents))]
        if self._strict:
            # The run stops at the shortest parent's end: there, as `_check_ends` decides.
            end = min(
                provenance.length_of(p, tracer, position) for p, e in zip(parents, ended) if e
            )
            there = [not tracer.exists(parent, end) for parent in parents]
            if not all(there):
                first = there.index(True)
                if first > 0:
                    raise provenance.EndOfStream(str(_strict_error(first, "shorter")))
                raise provenance.EndOfStream(str(_strict_error(there.index(False), "longer")))
        raise provenance.EndOfStream


def _strict_error(i: int, why: str) -> ValueError:
    """Grain's (and CPython's) message: argument `i + 1` against the ones before it."""
    plural = " " if i == 1 else "s 1-"
    return ValueError(f"ZipIterDataset argument {i + 1} is {why} than argument{plural}{i}")


class _ZipIterator(DatasetIterator[tuple[Any, ...]]):
    """Its state is the default of several parents: `{"stage": "zip", "parents": [...]}`."""

    stage = "zip"

    def __init__(self, parents: list[DatasetIterator[Any]], strict: bool = True) -> None:
        super().__init__(parents)
        self._parents = parents
        self._strict = strict
        self._pending: ValueError | None = None  # found by _next_many, raised next

    def __next__(self) -> tuple[Any, ...]:
        if self._pending is not None:
            raise self._pending
        row = []
        for i, p in enumerate(self._parents):
            try:
                row.append(next(p))
            except StopIteration:
                if self._strict:
                    self._check_ends(i)
                raise
        return tuple(row)

    def _check_ends(self, i: int) -> None:
        """Parent `i` ended: as `zip(strict=True)`, every other must end there too."""
        if i > 0:
            raise _strict_error(i, "shorter")
        for j, p in enumerate(self._parents[1:], 1):
            try:
                next(p)
            except StopIteration:
                continue
            raise _strict_error(j, "longer")

    def _next_many(self, n: int) -> list[tuple[Any, ...]]:
        if self._pending is not None:
            raise self._pending
        columns = [p._next_many(n) for p in self._parents]
        lengths = [len(c) for c in columns]
        if self._strict and min(lengths) != max(lengths):
            short = lengths.index(min(lengths))
            if short > 0:
                self._pending = _strict_error(short, "shorter")
            else:
                longer = next(j for j, k in enumerate(lengths) if k > lengths[0])
                self._pending = _strict_error(longer, "longer")
        return list(zip(*columns))


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

    @property
    def _element_spec(self) -> Any:
        return tuple(parent_spec(p) for p in self._parents)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """One record of each parent, at the same position of the same epoch; a tuple's
        part `i` has offset `(i,)`."""
        if self._len == 0:
            raise provenance.EndOfStream
        epoch, pos = divmod(position, self._len)
        return [
            provenance.Origin(i, epoch * n + pos, (i,), source=i) for i, n in enumerate(self._lens)
        ]
