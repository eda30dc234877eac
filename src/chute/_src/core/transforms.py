"""Transformations as classes (`MapTransform`, `RandomMapTransform`, ..., as in Grain).

A plain callable works wherever a transform class does; the `as_*_fn` helpers turn either
into the bare function a stage calls, and reject anything else with the fix.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from chute._src.core import tree

T_contra = TypeVar("T_contra", contravariant=True)
S_co = TypeVar("S_co", covariant=True)


class MapTransform(abc.ABC, Generic[T_contra, S_co]):
    """A deterministic one-to-one transformation: implement `map(element)`.

    Type checkers read the element types from `map`'s annotations; a subclass may also
    name them, `class Tokenize(MapTransform[str, list[int]])`, to have its `map` checked.
    """

    @abc.abstractmethod
    def map(self, element: T_contra) -> S_co:
        """Returns the transformed element."""


class RandomMapTransform(abc.ABC, Generic[T_contra, S_co]):
    """A random one-to-one transformation: implement `random_map(element, rng)`.

    All randomness must come from `rng`, an `np.random.Generator` keyed by the pipeline
    seed and the element's index, so the same element gets the same draw on every run, for
    any number of threads or workers, and after a restore.
    """

    @abc.abstractmethod
    def random_map(self, element: T_contra, rng: np.random.Generator) -> S_co:
        """Returns the transformed element."""


class FilterTransform(abc.ABC, Generic[T_contra]):
    """Keeps the elements for which `filter(element)` is true."""

    @abc.abstractmethod
    def filter(self, element: T_contra) -> bool:
        """True to keep `element`."""


class MapWithIndex(abc.ABC, Generic[T_contra, S_co]):
    """A transformation that also sees the element's index: `map_with_index(i, element)`."""

    @abc.abstractmethod
    def map_with_index(self, index: int, element: T_contra) -> S_co:
        """Returns the transformed element."""


# What the chain methods accept besides plain functions, as type checkers see it: any
# object with the method (a subclass of the class above, whose annotations give the
# element types). Parameters are positional-only, so a subclass may name them freely.


class SupportsMap(Protocol[T_contra, S_co]):
    def map(self, element: T_contra, /) -> S_co: ...


class SupportsRandomMap(Protocol[T_contra, S_co]):
    def random_map(self, element: T_contra, rng: np.random.Generator, /) -> S_co: ...


class SupportsFilter(Protocol[T_contra]):
    def filter(self, element: T_contra, /) -> object: ...


class SupportsMapWithIndex(Protocol[T_contra, S_co]):
    def map_with_index(self, index: int, element: T_contra, /) -> S_co: ...


@dataclasses.dataclass(frozen=True)
class Batch:
    """Groups consecutive elements into batches (an operation for `DataLoader`)."""

    batch_size: int
    drop_remainder: bool = False
    batch_fn: Callable[[list[Any]], Any] | None = None

    def __post_init__(self) -> None:
        check_batch_size(self.batch_size, "Batch")


class TypeConversion(MapTransform[Any, Any]):
    """Casts every numeric leaf of an element to `to_type` (e.g. `np.float32`).

    >>> TypeConversion(to_type=np.float32).map({"x": np.arange(2), "name": "a"})
    {'x': array([0., 1.], dtype=float32), 'name': 'a'}
    """

    def __init__(self, to_type: Any) -> None:
        self.to_type = np.dtype(to_type)

    def _convert(self, leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray | np.generic | int | float | bool):
            return np.asarray(leaf, dtype=self.to_type)
        return leaf

    def map(self, element: Any) -> Any:
        return tree.map_leaves(self._convert, element)

    def __repr__(self) -> str:
        return f"TypeConversion(to_type={self.to_type.name})"


def check_batch_size(batch_size: Any, where: str) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise TypeError(
            f"{where}: batch_size={batch_size!r} is invalid: batch_size must be an int; "
            "pass a positive integer such as batch_size=32."
        )
    if batch_size <= 0:
        raise ValueError(
            f"{where}: batch_size={batch_size} is invalid: batch_size must be > 0; "
            "pass a positive integer such as batch_size=32."
        )
    return int(batch_size)


def as_batch_fn(batch_fn: Any) -> Callable[[list[Any]], Any]:
    """`batch_fn`, or leaf-by-leaf stacking when it is None."""
    if batch_fn is None:
        return tree.stack
    if not callable(batch_fn):
        raise TypeError(
            f"batch: batch_fn={batch_fn!r} is not callable: pass a function taking a list "
            "of elements, or None to stack them."
        )
    return batch_fn


def _check_callable(fn: Any, where: str, wanted: str) -> None:
    if not callable(fn):
        raise TypeError(
            f"{where}: {fn!r} of type {type(fn).__name__} is not callable: {where} takes "
            f"a function or a {wanted} instance; pass one of those."
        )


def as_map_fn(t: Any, where: str = "map") -> Callable[[Any], Any]:
    if isinstance(t, MapTransform):
        return t.map
    if isinstance(t, type) and issubclass(t, MapTransform | RandomMapTransform | FilterTransform):
        raise TypeError(
            f"{where}: got the class {t.__name__}, not an instance: pass {t.__name__}(...)."
        )
    for cls, method in (
        (RandomMapTransform, "random_map"),
        (FilterTransform, "filter"),
        (MapWithIndex, "map_with_index"),
    ):
        if isinstance(t, cls):
            raise TypeError(
                f"{where}: {t!r} is a {cls.__name__}, which {where} cannot run: "
                f"use .{method}(...) for it."
            )
    _check_callable(t, where, "MapTransform")
    return t


def as_random_map_fn(
    t: Any, where: str = "random_map"
) -> Callable[[Any, np.random.Generator], Any]:
    if isinstance(t, RandomMapTransform):
        return t.random_map
    _check_callable(t, where, "RandomMapTransform")
    return t


def as_filter_fn(t: Any, where: str = "filter") -> Callable[[Any], bool]:
    if isinstance(t, FilterTransform):
        return t.filter
    _check_callable(t, where, "FilterTransform")
    return t


def as_map_with_index_fn(t: Any, where: str = "map_with_index") -> Callable[[int, Any], Any]:
    if isinstance(t, MapWithIndex):
        return t.map_with_index
    _check_callable(t, where, "MapWithIndex")
    return t


def describe(fn: Any) -> str:
    """`name @ file:line` for a function, the repr of a transform object."""
    target = getattr(fn, "__self__", None)
    if target is not None and isinstance(
        target, MapTransform | RandomMapTransform | FilterTransform | MapWithIndex
    ):
        return (
            repr(target) if type(target).__repr__ is not object.__repr__ else type(target).__name__
        )
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        code = fn.__code__
        return f"{name} @ .../{'/'.join(code.co_filename.split('/')[-2:])}:{code.co_firstlineno}"
    except AttributeError:
        try:
            return f"{name} @ {inspect.getsourcefile(fn)}"
        except TypeError:
            return str(name)
