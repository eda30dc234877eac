"""`ShapeDtypeStruct` and `get_element_spec`: the shapes and dtypes of a dataset's elements.

Every dataset has Grain's private `_element_spec`, inferred from the stages without
reading: a source that knows its elements (`MapDataset.range`) gives the spec, a stage
whose elements are its parent's (filter, shuffle, slice, repeat, mix, prefetching, ...)
hands it on, `batch` adds a leading axis (its length with `drop_remainder=True`, else
None, as in Grain), and a map asks its transform's `output_spec(input_spec)`. A stage
that cannot infer raises as Grain's does: `ValueError` for a transform without
`output_spec`, `NotImplementedError` for a stage with no rule.

`get_element_spec(ds)` infers the same way and, where a stage cannot infer, computes the
first element of that stage instead (Grain raises there): stages after it infer from
that. So it never reads more than the first element of one stage, and a pipeline of
stages that infer reads nothing.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from chute._src.core import contract
from chute._src.core.contract import StageRole

if TYPE_CHECKING:
    from chute._src.core.node import _Node


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


class ElementSpecNotImplementedError(NotImplementedError):
    """A stage with no rule to infer its element spec (Grain's `NotImplementedError`)."""


class TransformSpecError(ValueError):
    """A map whose transform has no `output_spec` (Grain's `ValueError`)."""


_NOT_INFERRED = (ElementSpecNotImplementedError, TransformSpecError)

# True while `get_element_spec` runs: a stage that cannot infer is computed instead.
_COMPUTE_WHEN_UNKNOWN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "chute_compute_element_spec", default=False
)

_HANDS_ON = (StageRole.READER, StageRole.PREFETCH, StageRole.PASS_THROUGH)


def _is_spec_leaf(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type)


def map_specs(fn: Callable[[Any], Any], spec: Any) -> Any:
    """`fn` applied to every leaf (anything with `shape` and `dtype`) of `spec`, keeping
    its dicts, lists, tuples and namedtuples; None stays None."""
    if spec is None:
        return None
    if _is_spec_leaf(spec):
        return fn(spec)
    if isinstance(spec, dict):
        return type(spec)((k, map_specs(fn, v)) for k, v in spec.items())
    if isinstance(spec, tuple) and hasattr(spec, "_fields"):
        return type(spec)(*(map_specs(fn, v) for v in spec))
    if isinstance(spec, list | tuple):
        return type(spec)(map_specs(fn, v) for v in spec)
    return fn(spec)


def _leaf_spec(leaf: Any) -> Any:
    if leaf is None:
        return None
    array = np.asarray(leaf)
    return ShapeDtypeStruct(shape=tuple(array.shape), dtype=array.dtype)


def _spec_of_element(element: Any) -> Any:
    from chute._src.core import tree

    return tree.map_leaves(_leaf_spec, element)


def _computed(ds: Any) -> Any:
    """The spec of `ds`'s first element, computed."""
    from chute._src.core.dataset import MapDataset

    first = ds.to_iter_dataset() if isinstance(ds, MapDataset) else ds
    it = first._iter()
    try:
        element = next(it)
    except StopIteration:
        raise ValueError(
            f"get_element_spec: {ds!r} has no elements, and its element spec cannot be "
            "inferred without one: give its last stage an element spec (a map's transform "
            "an output_spec method), or check why it is empty."
        ) from None
    finally:
        it.close()
    return _spec_of_element(element)


def parent_spec(parent: _Node) -> Any:
    """The element spec of `parent`, as a stage's `_element_spec` asks for it: inferred,
    or, under `get_element_spec`, computed where it cannot be inferred."""
    try:
        return parent._element_spec
    except _NOT_INFERRED:
        if not _COMPUTE_WHEN_UNKNOWN.get():
            raise
        return _computed(parent)


def inferred(ds: _Node) -> Any:
    """The default `_element_spec` of a stage: its first parent's when it hands on that
    parent's elements (its role, or `_keeps_element_spec`), else Grain's error."""
    if ds.parents and (getattr(ds, "_keeps_element_spec", False) or contract.role(ds) in _HANDS_ON):
        return parent_spec(ds.parents[0])
    raise ElementSpecNotImplementedError(
        f"`element_spec` inference is not implemented for {type(ds).__name__}: define its "
        "`_element_spec` property, or use experimental.get_element_spec(ds), which "
        "computes the first element where a stage cannot infer."
    )


def transform_output_spec(ds: _Node, fn: Any) -> Any:
    """The `_element_spec` of a map stage applying `fn` (a transform's bound method, or a
    callable): the transform's `output_spec(parent spec)`, as in Grain."""
    owner = getattr(fn, "__self__", None)
    transform = owner if _is_transform(owner) else fn
    output_spec = getattr(transform, "output_spec", None)
    if not callable(output_spec):
        from chute._src.core.transforms import describe

        name = describe(fn)
        raise TransformSpecError(
            f"Cannot infer element spec for transform {name} because it does not implement "
            f"`output_spec` method. Implement `{name}.output_spec(self, input_spec: "
            "PyTree[ShapeDtypeStructProtocol]) -> PyTree[ShapeDtypeStructProtocol]` to "
            "enable element spec inference."
        )
    return output_spec(parent_spec(ds.parents[0]))


def _is_transform(obj: Any) -> bool:
    from chute._src.core.transforms import (
        FilterTransform,
        MapTransform,
        MapWithIndex,
        RandomMapTransform,
    )

    return isinstance(obj, MapTransform | RandomMapTransform | MapWithIndex | FilterTransform)


def batch_spec(
    ds: _Node, batch_size: int, drop_remainder: bool, batch_fn: Any, default_fn: Any
) -> Any:
    """The `_element_spec` of a batch stage, as Grain infers it: each leaf gets a leading
    axis of `batch_size` with `drop_remainder=True`, else None (the last batch may be
    smaller); a `batch_fn` with `output_spec(input_spec, batch_size, drop_remainder)` says
    its own; another `batch_fn` cannot be inferred."""
    wrapped = batch_fn.func if isinstance(batch_fn, functools.partial) else batch_fn
    output_spec = getattr(wrapped, "output_spec", None)
    if batch_fn is not default_fn and callable(output_spec):
        return output_spec(parent_spec(ds.parents[0]), batch_size, drop_remainder)
    if batch_fn is not default_fn:
        raise ElementSpecNotImplementedError(
            "Element spec inference is not supported with custom batching functions: give "
            f"{type(wrapped).__name__} an output_spec(input_spec, batch_size, "
            "drop_remainder) method, or use experimental.get_element_spec(ds)."
        )
    size = batch_size if drop_remainder else None
    return map_specs(
        lambda x: ShapeDtypeStruct(shape=(size, *x.shape), dtype=x.dtype),
        parent_spec(ds.parents[0]),
    )


def get_element_spec(ds: Any) -> Any:
    """The element structure of `ds` (a MapDataset or an IterDataset) with a
    `ShapeDtypeStruct` for every leaf.

    Inferred from the stages as Grain does (a batch's leading axis is None unless it
    drops its remainder); where a stage cannot infer (a map whose transform has no
    `output_spec`), the first element of that stage is computed instead, where Grain
    raises.

    >>> import chute
    >>> get_element_spec(chute.MapDataset.range(10).batch(4))
    ShapeDtypeStruct(shape=(None,), dtype=dtype('int64'))
    >>> get_element_spec(chute.MapDataset.range(10).map(lambda x: {"x": x}).batch(4))
    {'x': ShapeDtypeStruct(shape=(None,), dtype=dtype('int64'))}
    """
    from chute._src.core.dataset import IterDataset, MapDataset

    if not isinstance(ds, MapDataset | IterDataset):
        raise TypeError(
            f"get_element_spec: {ds!r} is not a MapDataset or an IterDataset: pass a dataset."
        )
    token = _COMPUTE_WHEN_UNKNOWN.set(True)
    try:
        return parent_spec(ds)
    finally:
        _COMPUTE_WHEN_UNKNOWN.reset(token)
