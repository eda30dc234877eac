"""`Columns`: consecutive elements of one structure, held as one array per leaf.

A worker process sends a chunk whose elements are structures of numpy arrays of equal
shapes and dtypes (padded token rows, images of one size) as `Columns`: each leaf stacked
once in the worker, one buffer each on the way, instead of hundreds of small arrays
pickled and rebuilt one by one. The reader hands such chunks on to a `batch` directly above
it (`DatasetIterator._next_columns`), which cuts and joins columns instead of stacking the
elements; any other stage gets the elements one by one, as rows (views of the columns).
Element `i` is the same either way, and a batch of columns is what `tree.stack` makes of
its rows: the same structure, values, dtypes and shapes, in memory of its own.

Only what `tree.stack` stacks leaf by leaf is sent so: dicts, lists, tuples and
namedtuples whose leaves are numpy arrays (not of objects, in the machine's byte order)
with the same shape and dtype in every element, and the same keys in the same order.
Anything else (a None, a ragged row, a string leaf) leaves the chunk a list.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from chute._src.core import outbuf

__all__ = ["Columns", "columns_of"]


class Columns(Sequence[Any]):
    """`len(leaves[0])` elements of structure `skeleton`: element `i`'s leaves are
    `leaves[j][i]`. A sequence of its elements (rows, built when asked for)."""

    __slots__ = ("_keys", "_owned", "leaves", "skeleton")

    def __init__(self, skeleton: Any, leaves: list[np.ndarray], owned: bool) -> None:
        self.skeleton = skeleton
        self.leaves = leaves
        self._owned = owned  # the leaves are arrays of their own, not views of bigger ones
        # A dict of arrays (the common element): its keys, for building rows quickly.
        flat = skeleton[0] == "d" and all(c[0] == "a" for c in skeleton[3])
        self._keys: tuple[Any, ...] | None = skeleton[2] if flat else None

    def __len__(self) -> int:
        return len(self.leaves[0])

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        # `leaf[i, ...]`: a 0-d leaf comes back a 0-d array, as it went, not a scalar.
        if self._keys is not None:
            return dict(zip(self._keys, [leaf[i, ...] for leaf in self.leaves]))
        return _build(self.skeleton, iter([leaf[i, ...] for leaf in self.leaves]))

    def __iter__(self) -> Iterator[Any]:
        return (self[k] for k in range(len(self)))

    def __reduce__(self) -> tuple[Any, ...]:
        return Columns, (self.skeleton, self.leaves, True)

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.leaves)

    def take(self, start: int, stop: int) -> Columns:
        """Elements `[start, stop)`, as views of these columns."""
        if start == 0 and stop == len(self):
            return self
        return Columns(self.skeleton, [leaf[start:stop] for leaf in self.leaves], False)

    def stacked(self) -> Any:
        """The elements stacked leaf by leaf (`tree.stack` of the rows), in arrays of their
        own: a batch never holds on to a larger chunk, nor shares memory with its rows."""
        leaves = self.leaves if self._owned else [_copy(leaf) for leaf in self.leaves]
        return _build(self.skeleton, iter(leaves))

    @staticmethod
    def join(pieces: list[Columns]) -> Columns:
        """The elements of `pieces` (of one skeleton) one after the other: the one piece
        itself, or new columns holding copies."""
        if len(pieces) == 1:
            return pieces[0]
        leaves = [_concatenate([p.leaves[j] for p in pieces]) for j in range(len(pieces[0].leaves))]
        return Columns(pieces[0].skeleton, leaves, True)

    @staticmethod
    def of_dict(arrays: dict[str, np.ndarray]) -> Columns | None:
        """Elements `{k: arrays[k][i]}`: the rows of a batch a stage made itself (a packer's
        rows), as columns of their own; None if an array holds objects or its byte order
        is not the machine's."""
        leaves = list(arrays.values())
        if not leaves or any(a.dtype.hasobject or not a.dtype.isnative for a in leaves):
            return None
        children = tuple(("a", a.shape[1:], a.dtype) for a in leaves)
        return Columns(("d", dict, tuple(arrays), children), leaves, True)

    def __repr__(self) -> str:
        return f"Columns({len(self)} elements, {len(self.leaves)} leaves)"


def columns_of(items: list[Any]) -> Columns | None:
    """`items` as `Columns` when they are all of one structure of same-shaped numpy arrays
    (see the module's docstring), else None. Each column is stacked with `outbuf.stack`:
    in a worker, straight into its shared-memory slab when large."""
    if len(items) < 2:
        return None
    first: list[np.ndarray] = []
    skeleton: Any = _flatten(items[0], first)
    if skeleton is None or not first:
        return None
    per_leaf: list[list[np.ndarray]] = [[leaf] for leaf in first]
    if skeleton[0] == "d" and all(c[0] == "a" for c in skeleton[3]):
        # A dict of arrays, the common element: checked without building its skeleton.
        _, _, keys, children = skeleton
        specs = [(shape, dtype) for _, shape, dtype in children]
        for x in items[1:]:
            if type(x) is not dict or tuple(x) != keys:
                return None
            for column, (shape, dtype), v in zip(per_leaf, specs, x.values()):
                if type(v) is not np.ndarray or v.shape != shape or v.dtype != dtype:
                    return None
                column.append(v)
        return Columns(skeleton, [outbuf.stack(column) for column in per_leaf], True)
    scratch: list[np.ndarray] = []
    for x in items[1:]:
        scratch.clear()
        if _flatten(x, scratch) != skeleton:
            return None
        for column, leaf in zip(per_leaf, scratch):
            column.append(leaf)
    return Columns(skeleton, [outbuf.stack(column) for column in per_leaf], True)


# A skeleton is a hashable tuple: ("a", shape, dtype) for an array leaf, ("d", type, keys,
# children) for a dict, ("n", type, children) for a namedtuple, ("s", type, children) for
# a list or tuple. Two elements stack as columns when their skeletons are equal.


def _flatten(x: Any, leaves: list[np.ndarray]) -> Hashable | None:
    """`x`'s skeleton, its leaves appended to `leaves`; None if `x` is not made of
    structures and numpy arrays only."""
    if type(x) is np.ndarray:  # exactly: a subclass (a masked array) may stack otherwise
        if x.dtype.hasobject or not x.dtype.isnative:  # (stacking makes byte order native)
            return None
        leaves.append(x)
        return ("a", x.shape, x.dtype)
    cls = type(x)
    # Exact types (and namedtuples): a row is rebuilt with `cls(...)`, which another
    # subclass's constructor (a defaultdict's) may not take.
    if cls is dict:
        children = tuple(_flatten(v, leaves) for v in x.values())
        return None if None in children else ("d", cls, tuple(x), children)
    if cls is list or cls is tuple:
        children = tuple(_flatten(v, leaves) for v in x)
        return None if None in children else ("s", cls, children)
    if isinstance(x, tuple) and hasattr(cls, "_make") and hasattr(cls, "_fields"):
        children = tuple(_flatten(v, leaves) for v in x)
        return None if None in children else ("n", cls, children)
    return None


def _build(skeleton: Any, leaves: Iterator[np.ndarray]) -> Any:
    """The structure `skeleton` with its leaves taken from `leaves`, in order; built as
    `tree.stack` builds a batch of that structure."""
    kind = skeleton[0]
    if kind == "a":
        return next(leaves)
    if kind == "d":
        _, cls, keys, children = skeleton
        return cls((k, _build(c, leaves)) for k, c in zip(keys, children))
    if kind == "n":
        return skeleton[1](*(_build(c, leaves) for c in skeleton[2]))
    return skeleton[1](_build(c, leaves) for c in skeleton[2])


def _copy(leaf: np.ndarray) -> np.ndarray:
    out = outbuf.empty(leaf.shape, leaf.dtype)
    np.copyto(out, leaf)
    return out


def _concatenate(parts: list[np.ndarray]) -> np.ndarray:
    first = parts[0]
    out = outbuf.empty((sum(len(p) for p in parts), *first.shape[1:]), first.dtype)
    return np.concatenate(parts, out=out)
