"""`ShapeDtypeStruct` and `get_element_spec`: the shapes and dtypes of a dataset's elements."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import numpy as np

from chute._src.core import tree


@runtime_checkable
class ShapeDtypeStructProtocol(Protocol):
    """Anything with a `shape` and a `dtype` (a `ShapeDtypeStruct`, a numpy array, a
    `jax.ShapeDtypeStruct`, ...): `isinstance(x, ShapeDtypeStructProtocol)` checks it, as
    in Grain."""

    @property
    def shape(self) -> tuple[int | None, ...]: ...

    @property
    def dtype(self) -> Any: ...


@dataclasses.dataclass(slots=True, frozen=True)
class ShapeDtypeStruct:
    """A shape and a dtype."""

    shape: tuple[int | None, ...]
    dtype: Any


def _leaf_spec(leaf: Any) -> Any:
    if leaf is None:
        return None
    array = np.asarray(leaf)
    return ShapeDtypeStruct(shape=tuple(array.shape), dtype=array.dtype)


def get_element_spec(ds: Any) -> Any:
    """The element structure of `ds` (a MapDataset or an IterDataset) with a
    `ShapeDtypeStruct` for every leaf.

    chute computes the first element to find it (Grain infers it from the stages, which
    it can do for a few of them).

    >>> import chute
    >>> get_element_spec(chute.MapDataset.range(10).map(lambda x: {"x": x}).batch(4))
    {'x': ShapeDtypeStruct(shape=(4,), dtype=dtype('int64'))}
    """
    from chute._src.core.dataset import IterDataset, MapDataset

    if isinstance(ds, MapDataset):
        first = ds.to_iter_dataset()
    elif isinstance(ds, IterDataset):
        first = ds
    else:
        raise TypeError(
            f"get_element_spec: {ds!r} is not a MapDataset or an IterDataset: pass a dataset."
        )
    it = iter(first)
    try:
        element = next(it)
    except StopIteration:
        raise ValueError(
            f"get_element_spec: {ds!r} has no elements, so it has no element spec."
        ) from None
    finally:
        it.close()
    return tree.map_leaves(_leaf_spec, element)
