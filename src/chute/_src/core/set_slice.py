"""Grain's `set_slice`: a source changed in place to read one share of its data.

Grain's workers call it on their copy of a pipeline to deal the data out to themselves;
chute's workers compute chunks of one index order instead and never call it, but code
written for Grain may. `SourceMapDataset`/`RangeMapDataset.set_slice(slice(i, None, n),
sequential_slice=True)` keep the contiguous share `i` of `n` (Grain's `even_split`: the
first `len % n` shares one longer), always of the data the source was made with;
`InterleaveIterDataset` (and so `ParquetIterDataset`) keep `datasets[sl]` of the ones
they have.

A dataset is otherwise an immutable description, and the stages built on it have read
what they need of it (its length): so `set_slice` is refused once stages were built on
the dataset, naming one. Stages are tracked only for the datasets that can be sliced
(`_slices_in_place`), in a table of weak references beside them, not on them.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chute._src.core.node import _Node

_BUILT_ON: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()


class SetSliceError(ValueError, AssertionError):
    """A `set_slice` call chute cannot follow (Grain asserts its arguments, so this is also
    an `AssertionError`)."""


def note_parents(child: _Node, parents: Sequence[_Node]) -> None:
    """Records `child` as built on those of `parents` that can be sliced in place."""
    for p in parents:
        if getattr(p, "_slices_in_place", False):
            _BUILT_ON.setdefault(p, weakref.WeakSet()).add(child)


def check_unbuilt(ds: _Node, where: str) -> None:
    """Raises when a stage was built on `ds` (and still exists)."""
    children = list(_BUILT_ON.get(ds, ()))
    if children:
        raise SetSliceError(
            f"{where}: a stage was already built on this dataset ({children[0]!r}): "
            "set_slice changes the dataset in place, and the stages built on it have read "
            "its length. Call set_slice before building on the dataset, or slice it into a "
            "new one with ds[start:stop] (MapDataset.slice)."
        )


def contiguous_share(length: int, sl: Any, sequential_slice: bool, where: str) -> tuple[int, int]:
    """`[start, end)` of share `sl.start` of `sl.step` over `length` elements (Grain's
    `even_split`, no remainder dropped: the first `length % step` shares are one longer)."""
    if not sequential_slice:
        raise SetSliceError(
            f"{where}: sequential_slice=False is not supported: a source is sliced to a "
            "contiguous share, as in Grain (pass sequential_slice=True); for every n-th "
            "element use ds[start::n] (MapDataset.slice) instead."
        )
    if not isinstance(sl, slice):
        raise SetSliceError(f"{where}: sl={sl!r} is not a slice: pass slice(index, None, count).")
    index, count = sl.start, sl.step
    if not (
        isinstance(index, int)
        and isinstance(count, int)
        and not isinstance(index, bool)
        and count >= 1
        and 0 <= index < count
    ):
        raise SetSliceError(
            f"{where}: sl={sl!r} is invalid: it names share `start` of `step` shares, so "
            "0 <= start < step; e.g. slice(2, None, 3) keeps the third of three."
        )
    per, extra = divmod(length, count)
    start = per * index + min(index, extra)
    return start, start + per + (index < extra)


def reset_memos(ds: _Node) -> None:
    """Forgets what `ds` remembered of itself (its identity and fingerprint)."""
    ds._fingerprint_memo = None
    ds._identity_memo = None


class SlicedSource:
    """Elements `[start, end)` of a random-access source, as a source."""

    def __init__(self, source: Any, start: int, end: int) -> None:
        self.source, self.start, self.end = source, start, end

    def __len__(self) -> int:
        return self.end - self.start

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < self.end - self.start:
            raise IndexError(f"index {index} is out of range for {self!r}")
        return self.source[self.start + index]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        from chute._src.core.data_source import getitems

        return getitems(self.source, [self.start + i for i in indices])

    def __repr__(self) -> str:
        return f"{type(self.source).__name__}[{self.start}:{self.end}]"
