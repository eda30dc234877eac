"""`MapDataset`: a lazy, random-access dataset, and its chain methods (each a thin
constructor of a named class in `ops/`)."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    SupportsIndex,
    TypeVar,
    cast,
    overload,
)

import numpy as np

from chute._src.core import set_slice
from chute._src.core.chain import operation
from chute._src.core.node import _Node

if TYPE_CHECKING:
    from chute._src.core.data_source import RandomAccessDataSource
    from chute._src.core.iter_dataset import IterDataset
    from chute._src.core.iterator import DatasetIterator
    from chute._src.core.options import ReadOptions
    from chute._src.core.transforms import (
        SupportsFilter,
        SupportsMap,
        SupportsMapWithIndex,
        SupportsRandomMap,
    )
    from chute._src.ops.cache import CacheMapDataset

# A dataset is an immutable description, so a MapDataset[int] is a MapDataset[float]:
# the element type is covariant. Chain methods take it only inside callables.
T = TypeVar("T", covariant=True)
S = TypeVar("S")
U = TypeVar("U")
P = ParamSpec("P")

Stackable = int | float | complex | np.generic | np.ndarray
"""Elements that `batch` (without `batch_fn`) stacks into one `np.ndarray`."""


class MapDataset(_Node, Generic[T]):
    """A lazy, random-access dataset: `len(ds)`, `ds[i]`, `ds[a:b:c]`.

    >>> import chute
    >>> ds = chute.MapDataset.range(10).shuffle(seed=1).map(lambda x: x * 10)
    >>> len(ds), sorted(ds[i] for i in range(10))[:3]
    (10, [0, 10, 20])
    >>> [b.tolist() for b in ds.batch(4)]
    [[20, 90, 0, 40], [50, 60, 70, 10], [80, 30]]
    """

    _parents: tuple[MapDataset[Any], ...]

    def __init__(self, parents: MapDataset[Any] | Sequence[MapDataset[Any]] = ()) -> None:
        super().__init__(parents)
        # True when some upstream stage may produce None (a filtered element).
        self._may_be_none: bool = any(p._may_be_none for p in self._parents)
        set_slice.note_parents(self, self._parents)

    _slices_in_place: bool = False
    """True for a dataset with Grain's `set_slice`, which changes it in place
    (`core/set_slice.py`): the stages built on it are tracked, to refuse it after them."""

    # -- what every node implements ----------------------------------------------------------

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of elements of one epoch (`INFINITE` when repeated forever)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A stage written as in Grain (`__getitem__(index)`, no `_getitems`) is adapted
        here, once, when its class is made: its `_getitems` asks for one index at a time."""
        super().__init_subclass__(**kwargs)
        if "__getitem__" in cls.__dict__ and "_getitems" not in cls.__dict__:
            cls._getitems = _getitems_one_at_a_time  # type: ignore[method-assign]
        elif "_getitems" in cls.__dict__:
            # Any sequence of indices, as Grain's takes (`ds._getitems([0, 3])`); each
            # stage's own receives an int64 array.
            cls._getitems = _indices_as_array(cls.__dict__["_getitems"])  # type: ignore[method-assign]
        cls._unimplemented = "__getitem__" if cls._getitems is MapDataset._getitems else None

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        """Elements at `indices` (int64, >= 0; past `len` means a later epoch).

        chute's stages compute a whole block here; a stage written as in Grain defines
        `__getitem__(index)` instead (see `__init_subclass__`). A class with neither
        cannot be instantiated (`_Node.__init__`)."""
        raise self._unimplemented_error()  # a subclass that skipped _Node.__init__

    # -- access --------------------------------------------------------------------------------

    @overload
    def __getitem__(self, index: SupportsIndex) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> MapDataset[T]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> T | MapDataset[T]:
        """The element at `index` (None where a `filter` rejected it), or a slice of `self`."""
        if isinstance(index, slice):
            return self.slice(index)
        try:
            i = int(index)  # accepts numpy integers
        except (TypeError, ValueError):
            raise TypeError(
                f"MapDataset index {index!r} of type {type(index).__name__} is invalid: "
                "an index must be an int or a slice."
            ) from None
        if i < 0:
            if i + len(self) < 0:
                raise IndexError(f"index {i} is out of range for a dataset of {len(self)}")
            i += len(self)
        # Typed as T: only a position a `filter` rejected reads as None (see `filter`).
        return cast("T", self._getitems(np.array([i], dtype=np.int64))[0])

    def __iter__(self) -> DatasetIterator[T]:
        return iter(self.to_iter_dataset())

    def __repr__(self) -> str:
        return type(self).__name__

    # -- constructors ------------------------------------------------------------------------

    @staticmethod
    def source(source: RandomAccessDataSource[U]) -> MapDataset[U]:
        """A dataset reading a random-access source (`__len__` + `__getitem__`)."""
        return operation("SourceMapDataset")(source)

    @staticmethod
    def range(start: int, stop: int | None = None, step: int = 1) -> MapDataset[int]:
        """The integers of `range(start, stop, step)`."""
        return operation("RangeMapDataset")(start, stop, step)

    @staticmethod
    def mix(
        datasets: Sequence[MapDataset[U]],
        weights: Sequence[float] | Callable[[int], Sequence[float]] | None = None,
        *,
        step_size: int = 1,
    ) -> MapDataset[U]:
        """Interleaves `datasets` in the proportions of `weights` (uniform by default).

        Deterministic; the mixture ends when its first dataset runs out. `weights` may be
        a function of the step (`step = position // step_size`; docs/sequences.md).
        """
        return operation("MixedMapDataset")(datasets, weights, step_size=step_size)

    @staticmethod
    def select_from_datasets(
        datasets: Sequence[MapDataset[U]], selection_map: Any
    ) -> MapDataset[U]:
        """Element `k` is `datasets[d][i]` for `(d, i) = selection_map[k]`."""
        return operation("SelectFromDatasetsMapDataset")(datasets, selection_map)

    @staticmethod
    def concatenate(datasets: Sequence[MapDataset[U]]) -> MapDataset[U]:
        """The elements of `datasets` one after another."""
        return operation("ConcatenateMapDataset")(datasets)

    # -- transformations -------------------------------------------------------------------

    @overload
    def map(self, transform: SupportsMap[T, S]) -> MapDataset[S]: ...

    @overload
    def map(self, transform: Callable[[T], S]) -> MapDataset[S]: ...

    def map(self, transform: SupportsMap[T, S] | Callable[[T], S]) -> MapDataset[S]:
        """Applies `transform` (a function or a `MapTransform`) to every element."""
        return operation("MapMapDataset")(self, transform)

    @overload
    def map_with_index(self, transform: SupportsMapWithIndex[T, S]) -> MapDataset[S]: ...

    @overload
    def map_with_index(self, transform: Callable[[int, T], S]) -> MapDataset[S]: ...

    def map_with_index(
        self, transform: SupportsMapWithIndex[T, S] | Callable[[int, T], S]
    ) -> MapDataset[S]:
        """Applies `transform(index, element)` (a function or a `MapWithIndex`)."""
        return operation("MapWithIndexMapDataset")(self, transform)

    @overload
    def random_map(
        self, transform: SupportsRandomMap[T, S], *, seed: int | None = None
    ) -> MapDataset[S]: ...

    @overload
    def random_map(
        self, transform: Callable[[T, np.random.Generator], S], *, seed: int | None = None
    ) -> MapDataset[S]: ...

    def random_map(
        self,
        transform: SupportsRandomMap[T, S] | Callable[[T, np.random.Generator], S],
        *,
        seed: int | None = None,
    ) -> MapDataset[S]:
        """Applies `transform(element, rng)`; `rng` is keyed by (seed, element index)."""
        return operation("RandomMapMapDataset")(self, transform, seed=seed)

    def filter(self, transform: SupportsFilter[T] | Callable[[T], object]) -> MapDataset[T]:
        """Keeps elements where `transform` is true; others read as None, skipped when iterating."""
        return operation("FilterMapDataset")(self, transform)

    @overload
    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[T]], S],
        pad_value: None = None,
        padding_struct: None = None,
    ) -> MapDataset[S]: ...

    @overload
    def batch(
        self: MapDataset[Stackable],
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: None = None,
        pad_value: Any = None,
        padding_struct: Any = None,
    ) -> MapDataset[np.ndarray]: ...

    @overload
    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: None = None,
        pad_value: Any = None,
        padding_struct: Any = None,
    ) -> MapDataset[Any]: ...

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[T]], S] | None = None,
        pad_value: Any = None,
        padding_struct: Any = None,
    ) -> MapDataset[Any]:
        """Groups consecutive elements, stacking them leaf by leaf (or with `batch_fn`).

        Ragged array leaves are padded with `pad_value` (to the longest in the batch) or to
        the fixed first-axis lengths of `padding_struct` (shaped like the element).
        Type checkers see batches of numbers or arrays as `np.ndarray`, batches made by
        `batch_fn` as what it returns, and other batches (trees of arrays) as `Any`.
        """
        fn = operation("batch_fn_with_padding")(batch_fn, pad_value, padding_struct)
        return operation("BatchMapDataset")(
            self, batch_size, drop_remainder=drop_remainder, batch_fn=fn
        )

    def cache(
        self, *, max_elements: int | None = None, max_bytes: int | None = None
    ) -> CacheMapDataset[T]:
        """Keeps elements in memory, shared by every iterator and epoch of this dataset
        (and by `mp_prefetch`'s workers, through shared memory), as tf.data's `cache()`:
        index `i` reads position `i % len(ds)`. Past `max_elements` / `max_bytes`
        (default: a quarter of the available memory), elements are computed again.
        """
        return operation("CacheMapDataset")(self, max_elements=max_elements, max_bytes=max_bytes)

    def shuffle(self, seed: int | None = None) -> MapDataset[T]:
        """A global shuffle in O(1) memory; every epoch of a `repeat` is shuffled anew."""
        return operation("ShuffleMapDataset")(self, seed=seed)

    def repeat(
        self, num_epochs: int | None = None, *, reseed_each_epoch: bool = True
    ) -> MapDataset[T]:
        """Repeats `num_epochs` times (forever with None). Each epoch is shuffled and
        drawn anew; with `reseed_each_epoch=False`, every epoch repeats the first one's
        order and random draws."""
        return operation("RepeatMapDataset")(self, num_epochs, reseed_each_epoch=reseed_each_epoch)

    def slice(self, sl: slice) -> MapDataset[T]:
        """The elements selected by `sl` (what `ds[a:b:c]` calls); `ds[k::n]` shards."""
        return operation("SliceMapDataset")(self, sl)

    def seed(self, seed: int) -> MapDataset[T]:
        """Sets the seed that random stages after this point derive their seeds from."""
        return operation("SeedMapDataset")(self, seed)

    def pipe(
        self, func: Callable[Concatenate[MapDataset[T], P], S], /, *args: P.args, **kwargs: P.kwargs
    ) -> S:
        """`func(self, *args, **kwargs)`: lets a function take part in a method chain."""
        return func(self, *args, **kwargs)

    def apply(self, transformations: Any) -> MapDataset[Any]:
        """Applies one transform object or a sequence of them, each by its kind (`Batch`
        as `batch`, `MapTransform` as `map`, ...): `experimental.apply_transformations`."""
        return operation("apply_transformations")(self, transformations)

    def to_iter_dataset(
        self, read_options: ReadOptions | None = None, *, allow_nones: bool = False
    ) -> IterDataset[T]:
        """An `IterDataset` over this dataset in index order, skipping filtered elements
        (with `allow_nones=True`, as in Grain, a filtered element comes out as None).

        >>> import chute
        >>> ds = chute.MapDataset.range(4).filter(lambda x: x % 2)
        >>> list(ds.to_iter_dataset()), list(ds.to_iter_dataset(allow_nones=True))
        ([1, 3], [None, 1, None, 3])
        """
        return operation("PrefetchIterDataset")(self, read_options, allow_nones=allow_nones)


def _getitems_one_at_a_time(self: MapDataset[Any], indices: np.ndarray) -> list[Any]:
    """`_getitems` of a stage written as in Grain, with `__getitem__(index)`."""
    getitem = self.__getitem__
    return [getitem(i) for i in np.asarray(indices, dtype=np.int64).tolist()]


def _indices_as_array(getitems: Callable[[Any, np.ndarray], list[Any]]) -> Any:
    """`_getitems` taking any sequence of ints, as Grain's does: each stage's own receives
    them as an int64 array."""

    def _getitems(self: Any, indices: Any) -> list[Any]:
        if type(indices) is not np.ndarray:
            indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        return getitems(self, indices)

    _getitems.__doc__ = getitems.__doc__
    _getitems.__wrapped__ = getitems  # type: ignore[attr-defined]
    return _getitems
