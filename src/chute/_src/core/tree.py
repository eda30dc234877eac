"""Nested structures (dicts, tuples, lists, namedtuples, dataclasses) of array leaves.

`stack` is what `batch` uses: it turns a list of same-shaped structures into one structure
whose leaves are numpy arrays with a new leading axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chute._src.core import outbuf

_SCALARS = (int, float, bool, complex, np.generic, str, bytes)


def stack(elements: Sequence[Any]) -> Any:
    """Stacks a non-empty list of same-structured elements leaf by leaf.

    >>> stack([{"x": 1, "y": (2.0, "a")}, {"x": 3, "y": (4.0, "b")}])
    {'x': array([1, 3]), 'y': (array([2., 4.]), array(['a', 'b'], dtype='<U1'))}
    """
    if not elements:
        raise ValueError("batch: there are no elements to stack: a batch needs at least one.")
    first = elements[0]
    if isinstance(first, np.ndarray):
        try:
            return outbuf.stack(elements)
        except ValueError as e:
            shapes = sorted({np.shape(x) for x in elements})
            raise ValueError(
                f"batch: cannot stack arrays of different shapes {shapes}: elements of a batch "
                "must have equal shapes; pad them first (e.g. a map that pads to a fixed "
                "length), or pass batch_fn= to combine them yourself. (In Grain's words: "
                f"Expected all input elements to have the same structure but got: {shapes}.)"
            ) from e
    if isinstance(first, _SCALARS):
        return np.asarray(elements)
    if isinstance(first, dict):
        _check_same_keys(elements)
        return type(first)((k, stack([e[k] for e in elements])) for k in first)
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
        return type(first)(*(stack([e[i] for e in elements]) for i in range(len(first))))
    if isinstance(first, list | tuple):
        _check_same_length(elements)
        return type(first)(stack([e[i] for e in elements]) for i in range(len(first)))
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        names = [f.name for f in dataclasses.fields(first)]
        return type(first)(**{n: stack([getattr(e, n) for e in elements]) for n in names})
    if first is None:
        return None
    return np.asarray(elements)


def _check_same_keys(elements: Sequence[Any]) -> None:
    keys = elements[0].keys()
    for i, e in enumerate(elements):
        if not isinstance(e, dict) or e.keys() != keys:
            got = sorted(e.keys()) if isinstance(e, dict) else type(e).__name__
            raise ValueError(
                f"batch: element {i} of the batch has keys {got}, but the first has "
                f"{sorted(keys)}: all elements of a batch must have the same structure; "
                "make the map produce the same keys for every element, or pass batch_fn=. "
                "(In Grain's words: Expected all input elements to have the same structure but "
                f"got: keys {sorted(keys)} and {got}.)"
            )


def _check_same_length(elements: Sequence[Any]) -> None:
    n = len(elements[0])
    for i, e in enumerate(elements):
        if len(e) != n:
            raise ValueError(
                f"batch: element {i} of the batch has {len(e)} entries, but the first has {n}: "
                "all elements of a batch must have the same structure; pass batch_fn= to "
                "combine ragged elements yourself. (In Grain's words: Expected all input "
                f"elements to have the same structure but got: lengths {n} and {len(e)}.)"
            )


def map_leaves(fn: Callable[[Any], Any], tree: Any) -> Any:
    """Applies `fn` to every leaf of `tree`, keeping the structure."""
    if isinstance(tree, dict):
        return type(tree)((k, map_leaves(fn, v)) for k, v in tree.items())
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(map_leaves(fn, v) for v in tree))
    if isinstance(tree, list | tuple):
        return type(tree)(map_leaves(fn, v) for v in tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return dataclasses.replace(
            tree,
            **{f.name: map_leaves(fn, getattr(tree, f.name)) for f in dataclasses.fields(tree)},
        )
    return fn(tree)


def leaves(tree: Any) -> list[Any]:
    """The leaves of `tree`, depth first."""
    out: list[Any] = []
    map_leaves(out.append, tree)
    return out
