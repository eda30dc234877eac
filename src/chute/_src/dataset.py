"""The core types: `MapDataset` (random access), `IterDataset` (iterable).

Both are lazy descriptions of a pipeline: building one computes nothing. A `MapDataset`
node answers `_getitems(indices)` for a whole numpy block of indices at once, so index
arithmetic (shuffle, slice, repeat, batch) costs a few numpy calls per block, not a Python
call per element. Indices past `len(ds)` address later epochs: every node reads index `i`
as position `i % len` of epoch `i // len`, which is how `repeat` gives each epoch its own
shuffle and its own random draws. An `IterDataset` yields a `DatasetIterator`, which owns
all mutable state.

Each chain method is a thin constructor of a named class in its own module.
"""

from __future__ import annotations

import abc
import copy
import hashlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Self,
    SupportsIndex,
    TypeVar,
    cast,
    overload,
)

import numpy as np

from chute._src import observe
from chute._src.iterator import ThreadGuardedIterator
from chute._src.protocol import StageRole
from chute._src.seeding import derive_seed, validate_seed

if TYPE_CHECKING:
    from chute._src.iterator import DatasetIterator
    from chute._src.map.cache import CacheMapDataset
    from chute._src.options import MultiprocessingOptions, ReadOptions
    from chute._src.sources.protocol import RandomAccessDataSource
    from chute._src.transforms import (
        SupportsFilter,
        SupportsMap,
        SupportsMapWithIndex,
        SupportsRandomMap,
    )

# A dataset is an immutable description, so a MapDataset[int] is a MapDataset[float]:
# the element type is covariant. Chain methods take it only inside callables.
T = TypeVar("T", covariant=True)
S = TypeVar("S")
U = TypeVar("U")
P = ParamSpec("P")

Stackable = int | float | complex | np.generic | np.ndarray
"""Elements that `batch` (without `batch_fn`) stacks into one `np.ndarray`."""

INFINITE = sys.maxsize
"""The length of an infinitely repeated `MapDataset`, as in Grain."""

# Tags that keep the seeds of different kinds of stage apart.
SEED_TAG_SHUFFLE = 1
SEED_TAG_RANDOM_MAP = 2


class _Node(abc.ABC):  # noqa: B024 (its abstract methods are the core types')
    """What `MapDataset` and `IterDataset` share: the node protocol (parents, a role, how to
    rebuild with other parents), the pipeline seed, a fingerprint."""

    role: StageRole = StageRole.ORDER_DEPENDENT
    """What this stage is to the engine (`_src/protocol.py`); a class or instance attribute."""

    internal: bool = False
    """True for a stage the engine put in the pipeline, not the user (a stand-in for a
    stage moved into worker processes): the debug summary does not show it."""

    reads_shards: bool = False
    """True for a stage whose parents are the shards of one stream, each read whole, from
    its start or a saved state, on its own, and merged by this stage's own rule
    (`InterleaveIterDataset`): `mp_prefetch` then reads each shard in a worker process."""

    def __init__(self, parents: _Node | Sequence[_Node] = ()) -> None:
        # One dataset may be given alone, as in Grain: `super().__init__(parents=ds)`.
        self._parents: tuple[_Node, ...] = (
            (parents,) if isinstance(parents, _Node) else tuple(parents)
        )
        # The seed set upstream (`ds.seed(s)`); under several seeded parents (a mix), one
        # derived from all of them, in order, as in Grain.
        seeds = [p._pipeline_seed for p in self._parents if p._pipeline_seed is not None]
        self._pipeline_seed: int | None = (
            None if not seeds else seeds[0] if len(seeds) == 1 else derive_seed(*seeds)
        )
        self._depth: int = 1 + max((p._depth for p in self._parents), default=-1)
        self._fingerprint: str | None = None
        self._identity: tuple[str, ...] | None = None

    @property
    def parents(self) -> tuple[_Node, ...]:
        """The nodes this one reads from, in order."""
        return self._parents

    def with_parents(self, parents: Sequence[_Node]) -> Self:
        """This stage reading from `parents` instead: equivalent nodes (the same elements),
        such as a copy rewritten for worker processes or wrapped for timing. Every rewrite
        of a pipeline goes through here. The copy keeps this stage's parameters, its seed
        and its identity; a stage that derives more from its parents in `__init__` than
        these overrides it."""
        if len(parents) != len(self._parents):
            raise ValueError(
                f"{self!r}.with_parents got {len(parents)} parents, but the stage has "
                f"{len(self._parents)}: give one replacement for each of node.parents."
            )
        self.fingerprint  # noqa: B018 (computed here, with the identity: the copy keeps them)
        new = copy.copy(self)
        new._parents = tuple(parents)
        return new

    @property
    def concurrent(self) -> bool:
        """True when this stage computes its inputs on other threads or processes."""
        return False

    def for_workers(self, resources: list[Any]) -> Self:
        """This node as worker processes should receive it (parents already rewritten).

        A source holding a large in-memory list returns a copy that shares it through
        shared memory, appending what must be released (`unlink()`) to `resources`."""
        return self

    def _op_seed(self, seed: int | None, tag: int, where: str) -> int:
        """The seed of a random stage: its own, or one derived from the pipeline seed.

        The derivation is keyed by the stage's depth in the pipeline, so two random stages
        of one pipeline draw independent streams from one `ds.seed(...)`.
        """
        if seed is not None:
            return derive_seed(validate_seed(seed, where), tag)
        if self._pipeline_seed is None:
            raise ValueError(
                f"{where} has no seed: {where} is random and chute's randomness is always "
                f"seeded; pass {where}(..., seed=42), or set a seed for the whole pipeline "
                "before it with ds.seed(42)."
            )
        return derive_seed(self._pipeline_seed, tag, self._depth)

    def _fingerprint_params(self) -> str:
        """What of this stage's parameters fixes where its elements are (sizes, seeds,
        slicing, batch sizes), as checkpoints record it: never file paths, thread or worker
        counts, nor a user's function (a state restores after a map function is fixed)."""
        return ""

    @property
    def position_params(self) -> str:
        """What of this stage's parameters fixes where its elements are, as its state
        records it (`_fingerprint_params()`, which stages override)."""
        return self._fingerprint_params()

    def cache_identity(self) -> dict[str, Any]:
        """What, besides its parents, decides this stage's elements: named values that
        `IterDataset.cache(path)` hashes into its key, with the stage's type and the same of
        every parent. A function counts by its code, a source by what its `repr` says
        (files: their names), an options object, dict or set by its type only (thread and
        worker counts, memo tables: they never change the elements).

        The default describes the node by its own attributes (all but its parents and its
        cached fingerprint) and its fingerprint parameters. A stage overrides it to leave
        out what does not change its elements, or to add what its attributes do not show
        (a version, a setting read from elsewhere)."""
        identity: dict[str, Any] = {"(fingerprint params)": self._fingerprint_params()}
        for name, value in vars(self).items():
            if name not in ("_parents", "_fingerprint", "_identity"):
                identity[name] = value
        return identity

    @property
    def identity(self) -> tuple[str, ...]:
        """What fixes the positions of this node's elements, which a state records: one
        `"Kind(params)"` per stage, sources first, with `" <- [i, j]"` naming the entries it
        reads where that is not just the entry before. Stages that hand on their input
        unchanged (`PASS_THROUGH`: seeds, timing wrappers) are left out."""
        if self._identity is None:
            entries: list[str] = []
            index: dict[int, int] = {}

            def visit(node: _Node) -> int:
                done = index.get(id(node))
                if done is not None:
                    return done
                inputs = [visit(p) for p in node._parents]
                if node.role is StageRole.PASS_THROUGH and len(inputs) == 1:
                    index[id(node)] = inputs[0]
                    return inputs[0]
                name = type(node).__name__
                for suffix in ("MapDataset", "IterDataset"):
                    if name.endswith(suffix) and name != suffix:
                        name = name[: -len(suffix)]
                entry = f"{name}({node._fingerprint_params()})"
                if inputs != ([len(entries) - 1] if entries else []):
                    entry += f" <- {inputs}"
                entries.append(entry)
                index[id(node)] = len(entries) - 1
                return len(entries) - 1

            visit(self)
            self._identity = tuple(entries)
        return self._identity

    @property
    def fingerprint(self) -> str:
        """A short hash of `identity`."""
        if self._fingerprint is None:
            h = hashlib.blake2b(digest_size=8)
            h.update("\n".join(self.identity).encode())
            self._fingerprint = h.hexdigest()
        return self._fingerprint


def stages_sources_first(ds: MapDataset[Any]) -> list[MapDataset[Any]]:
    """Every stage of `ds`'s graph once, each after all of its parents."""
    order: list[MapDataset[Any]] = []
    seen: set[int] = set()

    def visit(node: MapDataset[Any]) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        for p in node._parents:
            visit(p)
        order.append(node)

    visit(ds)
    return order


N = TypeVar("N", bound=_Node)


def rewrite_graph(ds: N, fn: Callable[[N], N]) -> N:
    """`ds` with `fn` applied to every node, sources first, each node once: `fn` receives
    the node already rebuilt (`with_parents`) on its rewritten parents, when they changed."""
    memo: dict[int, N] = {}

    def visit(node: N) -> N:
        done = memo.get(id(node))
        if done is not None:
            return done
        parents = [visit(cast(N, p)) for p in node.parents]
        rebuilt = (
            node.with_parents(parents)
            if any(a is not b for a, b in zip(parents, node.parents))
            else node
        )
        memo[id(node)] = out = fn(rebuilt)
        return out

    return visit(ds)


def _indices_as_array(getitems: Callable[[Any, np.ndarray], list[Any]]) -> Any:
    """`_getitems` taking any sequence of ints, as Grain's does (`ds._getitems([0, 3])`):
    each stage's own receives them as an int64 array."""

    def _getitems(self: Any, indices: Any) -> list[Any]:
        if type(indices) is not np.ndarray:
            indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        return getitems(self, indices)

    _getitems.__doc__ = getitems.__doc__
    _getitems.__wrapped__ = getitems  # type: ignore[attr-defined]
    return _getitems


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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_getitems" in cls.__dict__:
            cls._getitems = _indices_as_array(cls.__dict__["_getitems"])  # type: ignore[method-assign]

    def __init__(self, parents: MapDataset[Any] | Sequence[MapDataset[Any]] = ()) -> None:
        super().__init__(parents)
        # True when some upstream stage may produce None (a filtered element).
        self._may_be_none: bool = any(p._may_be_none for p in self._parents)

    # -- what every node implements ----------------------------------------------------------

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of elements of one epoch (`INFINITE` when repeated forever)."""

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        """Elements at `indices` (int64, >= 0; past `len` means a later epoch).

        chute's stages compute a whole block here. The default serves a stage written as
        in Grain, with `__getitem__(index)`: it asks for one index at a time."""
        if type(self).__getitem__ is MapDataset.__getitem__:
            raise TypeError(
                f"{type(self).__name__} defines neither __getitem__ nor _getitems: a "
                "MapDataset subclass implements __len__ and __getitem__(index)."
            )
        getitem = self.__getitem__
        return [getitem(i) for i in np.asarray(indices, dtype=np.int64).tolist()]

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
        from chute._src.map.source import SourceMapDataset

        return SourceMapDataset(source)

    @staticmethod
    def range(start: int, stop: int | None = None, step: int = 1) -> MapDataset[int]:
        """The integers of `range(start, stop, step)`."""
        from chute._src.map.source import RangeMapDataset

        return RangeMapDataset(start, stop, step)

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
        from chute._src.map.mix import MixedMapDataset

        return MixedMapDataset(datasets, weights, step_size=step_size)

    @staticmethod
    def select_from_datasets(
        datasets: Sequence[MapDataset[U]], selection_map: Any
    ) -> MapDataset[U]:
        """Element `k` is `datasets[d][i]` for `(d, i) = selection_map[k]`."""
        from chute._src.map.mix import SelectFromDatasetsMapDataset

        return SelectFromDatasetsMapDataset(datasets, selection_map)

    @staticmethod
    def concatenate(datasets: Sequence[MapDataset[U]]) -> MapDataset[U]:
        """The elements of `datasets` one after another."""
        from chute._src.map.concatenate import ConcatenateMapDataset

        return ConcatenateMapDataset(datasets)

    # -- transformations -------------------------------------------------------------------

    @overload
    def map(self, transform: SupportsMap[T, S]) -> MapDataset[S]: ...

    @overload
    def map(self, transform: Callable[[T], S]) -> MapDataset[S]: ...

    def map(self, transform: SupportsMap[T, S] | Callable[[T], S]) -> MapDataset[S]:
        """Applies `transform` (a function or a `MapTransform`) to every element."""
        from chute._src.map.map import MapMapDataset

        return MapMapDataset(self, transform)

    @overload
    def map_with_index(self, transform: SupportsMapWithIndex[T, S]) -> MapDataset[S]: ...

    @overload
    def map_with_index(self, transform: Callable[[int, T], S]) -> MapDataset[S]: ...

    def map_with_index(
        self, transform: SupportsMapWithIndex[T, S] | Callable[[int, T], S]
    ) -> MapDataset[S]:
        """Applies `transform(index, element)` (a function or a `MapWithIndex`)."""
        from chute._src.map.map import MapWithIndexMapDataset

        return MapWithIndexMapDataset(self, transform)

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
        from chute._src.map.random_map import RandomMapMapDataset

        return RandomMapMapDataset(self, transform, seed=seed)

    def filter(self, transform: SupportsFilter[T] | Callable[[T], object]) -> MapDataset[T]:
        """Keeps elements where `transform` is true; others read as None, skipped when iterating."""
        from chute._src.map.filter import FilterMapDataset

        return FilterMapDataset(self, transform)

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
        from chute._src.map.batch import BatchMapDataset
        from chute._src.pad_batch import batch_fn_with_padding

        fn = batch_fn_with_padding(batch_fn, pad_value, padding_struct)
        return BatchMapDataset(self, batch_size, drop_remainder=drop_remainder, batch_fn=fn)

    def cache(
        self, *, max_elements: int | None = None, max_bytes: int | None = None
    ) -> CacheMapDataset[T]:
        """Keeps elements in memory, shared by every iterator and epoch of this dataset
        (and by `mp_prefetch`'s workers, through shared memory), as tf.data's `cache()`:
        index `i` reads position `i % len(ds)`. Past `max_elements` / `max_bytes`
        (default: a quarter of the available memory), elements are computed again.
        """
        from chute._src.map.cache import CacheMapDataset

        return CacheMapDataset(self, max_elements=max_elements, max_bytes=max_bytes)

    def shuffle(self, seed: int | None = None) -> MapDataset[T]:
        """A global shuffle in O(1) memory; every epoch of a `repeat` is shuffled anew."""
        from chute._src.map.shuffle import ShuffleMapDataset

        return ShuffleMapDataset(self, seed=seed)

    def repeat(self, num_epochs: int | None = None) -> MapDataset[T]:
        """Repeats `num_epochs` times (forever with None)."""
        from chute._src.map.repeat import RepeatMapDataset

        return RepeatMapDataset(self, num_epochs)

    def slice(self, sl: slice) -> MapDataset[T]:
        """The elements selected by `sl` (what `ds[a:b:c]` calls); `ds[k::n]` shards."""
        from chute._src.map.slice import SliceMapDataset

        return SliceMapDataset(self, sl)

    def seed(self, seed: int) -> MapDataset[T]:
        """Sets the seed that random stages after this point derive their seeds from."""
        from chute._src.map.seed import SeedMapDataset

        return SeedMapDataset(self, seed)

    def pipe(
        self, func: Callable[Concatenate[MapDataset[T], P], S], /, *args: P.args, **kwargs: P.kwargs
    ) -> S:
        """`func(self, *args, **kwargs)`: lets a function take part in a method chain."""
        return func(self, *args, **kwargs)

    def apply(self, transformations: Any) -> MapDataset[Any]:
        """Applies one transform object or a sequence of them, each by its kind (`Batch`
        as `batch`, `MapTransform` as `map`, ...): `experimental.apply_transformations`."""
        from chute._src.apply import apply_transformations

        return apply_transformations(self, transformations)

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
        from chute._src.iter.prefetch import PrefetchIterDataset

        return PrefetchIterDataset(self, read_options, allow_nones=allow_nones)


class IterDataset(_Node, Generic[T]):
    """A lazy iterable dataset; `iter(ds)` gives a checkpointable `DatasetIterator`.

    >>> import chute
    >>> ds = chute.MapDataset.range(6).to_iter_dataset().filter(lambda x: x % 2).batch(2)
    >>> [b.tolist() for b in ds]
    [[1, 3], [5]]
    """

    def __iter__(self) -> DatasetIterator[T]:
        """A fresh iterator, positioned at the start, for one thread at a time."""
        return ThreadGuardedIterator(self._iter())

    def _iter(self) -> DatasetIterator[T]:
        """`iter(self)` without the thread guard: what stages iterate their parents with."""
        observer = observe.observing()  # debug mode: see `_src/observe.py`
        if observer is not None:
            return observer.iterator(self, self._described_iterator)
        return self._described_iterator()

    def _described_iterator(self) -> DatasetIterator[T]:
        """`make_iterator()`, its state recording this stage's position-fixing parameters
        (`_fingerprint_params`, as the state's "params")."""
        it = self.make_iterator()
        params = self._fingerprint_params()
        if params and not it.stage_params:
            it.stage_params = params
        return it

    def make_iterator(self) -> DatasetIterator[T]:
        """A fresh iterator of this stage, reading fresh iterators of its parents
        (`self._parent_iter(i)`). Every chute stage implements it; `iter(ds)` adds the
        thread guard (and the timing of debug mode) around it.

        The default serves a stage written as in Grain, whose `__iter__` returns its
        iterator: it calls that."""
        if type(self).__iter__ is IterDataset.__iter__:
            raise TypeError(
                f"{type(self).__name__} defines neither make_iterator nor __iter__: an "
                "IterDataset subclass implements make_iterator() (or __iter__, as in Grain) "
                "returning a DatasetIterator."
            )
        return self.__iter__()

    def _parent_iter(self, i: int = 0) -> DatasetIterator[Any]:
        """A fresh iterator of parent `i`."""
        return cast("IterDataset[Any]", self._parents[i])._iter()

    def as_map_stage(self, parent: MapDataset[Any]) -> MapDataset[Any]:
        """For an `ELEMENT_WISE` stage: the same operation as a MapDataset stage on `parent`."""
        raise NotImplementedError(
            f"{self!r} is not element-wise (its role is {self.role}); only ELEMENT_WISE "
            "stages can be moved onto a MapDataset."
        )

    def __repr__(self) -> str:
        return type(self).__name__

    @staticmethod
    def source(source: Iterable[U] | Callable[[], Iterable[U]]) -> IterDataset[U]:
        """A stream of the elements of `source`: an iterable (a list, an object whose
        `__iter__` starts again), a function returning an iterator, or an object with
        `get_state()`/`set_state()` (or `state_dict()`/`load_state_dict()`, such as a
        Hugging Face `IterableDataset`).

        An object with state methods resumes exactly from its own state. The others resume
        by counting: the state is how many elements were handed out, and restoring creates
        a fresh iterator and skips that many (exact when it gives the same elements each
        time). One such stream is one unsplittable input: for worker processes, give one
        per shard to `experimental.InterleaveIterDataset`.
        """
        from chute._src.iter.iterable_source import IterableSourceIterDataset

        return IterableSourceIterDataset(source)

    @staticmethod
    def mix(
        datasets: Sequence[IterDataset[U]] | Mapping[str, IterDataset[U]],
        weights: Sequence[float] | Mapping[str, float] | Callable[[int], Any] | None = None,
        *,
        step_size: int = 1,
    ) -> IterDataset[U]:
        """Interleaves `datasets` (a list, or a dict by name) in the proportions of `weights`.

        Deterministic; ends when a component runs out. A mixture given as a dict restores
        a state taken before its weights or components changed. `weights` may be a
        function of the step (`step = position // step_size`), and the iterator's
        `set_weights` changes them between steps (docs/sequences.md).
        """
        from chute._src.iter.mix import MixedIterDataset

        return MixedIterDataset(datasets, weights, step_size=step_size)

    @overload
    def map(self, transform: SupportsMap[T, S]) -> IterDataset[S]: ...

    @overload
    def map(self, transform: Callable[[T], S]) -> IterDataset[S]: ...

    def map(self, transform: SupportsMap[T, S] | Callable[[T], S]) -> IterDataset[S]:
        """Applies `transform` (a function or a `MapTransform`) to every element."""
        from chute._src.iter.map import MapIterDataset

        return MapIterDataset(self, transform)

    @overload
    def map_with_index(self, transform: SupportsMapWithIndex[T, S]) -> IterDataset[S]: ...

    @overload
    def map_with_index(self, transform: Callable[[int, T], S]) -> IterDataset[S]: ...

    def map_with_index(
        self, transform: SupportsMapWithIndex[T, S] | Callable[[int, T], S]
    ) -> IterDataset[S]:
        """Applies `transform(index, element)`, index counting this stage's inputs."""
        from chute._src.iter.map import MapWithIndexIterDataset

        return MapWithIndexIterDataset(self, transform)

    @overload
    def random_map(
        self, transform: SupportsRandomMap[T, S], *, seed: int | None = None
    ) -> IterDataset[S]: ...

    @overload
    def random_map(
        self, transform: Callable[[T, np.random.Generator], S], *, seed: int | None = None
    ) -> IterDataset[S]: ...

    def random_map(
        self,
        transform: SupportsRandomMap[T, S] | Callable[[T, np.random.Generator], S],
        *,
        seed: int | None = None,
    ) -> IterDataset[S]:
        """Applies `transform(element, rng)`; `rng` is keyed by (seed, element position)."""
        from chute._src.iter.random_map import RandomMapIterDataset

        return RandomMapIterDataset(self, transform, seed=seed)

    def filter(self, transform: SupportsFilter[T] | Callable[[T], object]) -> IterDataset[T]:
        """Keeps the elements for which `transform` (a function or `FilterTransform`) is true."""
        from chute._src.iter.filter import FilterIterDataset

        return FilterIterDataset(self, transform)

    @overload
    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[T]], S],
        pad_value: None = None,
        padding_struct: None = None,
    ) -> IterDataset[S]: ...

    @overload
    def batch(
        self: IterDataset[Stackable],
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: None = None,
        pad_value: Any = None,
        padding_struct: Any = None,
    ) -> IterDataset[np.ndarray]: ...

    @overload
    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: None = None,
        pad_value: Any = None,
        padding_struct: Any = None,
    ) -> IterDataset[Any]: ...

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Callable[[list[T]], S] | None = None,
        pad_value: Any = None,
        padding_struct: Any = None,
    ) -> IterDataset[Any]:
        """Groups consecutive elements, stacking them leaf by leaf (or with `batch_fn`).

        Ragged array leaves are padded with `pad_value` (to the longest in the batch) or to
        the fixed first-axis lengths of `padding_struct` (shaped like the element).
        Type checkers see batches of numbers or arrays as `np.ndarray`, batches made by
        `batch_fn` as what it returns, and other batches (trees of arrays) as `Any`.
        """
        from chute._src.iter.batch import BatchIterDataset
        from chute._src.pad_batch import batch_fn_with_padding

        fn = batch_fn_with_padding(batch_fn, pad_value, padding_struct)
        return BatchIterDataset(self, batch_size, drop_remainder=drop_remainder, batch_fn=fn)

    def batch_by_tokens(
        self,
        max_tokens: int,
        *,
        length_fn: Callable[[T], int],
        max_batch_size: int | None = None,
        pad_to_multiple_of: int | None = None,
        drop_remainder: bool = False,
        window_size: int = 1000,
        sort: bool = True,
        seed: int | None = None,
        pad_value: Any = 0,
        batch_fn: Callable[[list[T]], Any] | None = None,
    ) -> IterDataset[Any]:
        """Batches whose padded size (`longest x count`) stays within `max_tokens`.

        Each window of `window_size` elements is sorted by `length_fn` and cut greedily;
        no batch spans two windows; with `seed` the batches of a window are handed out in
        a keyed random order. An element longer than `max_tokens` raises ValueError.
        `experimental.BatchByTokensIterDataset`; docs/sequences.md.
        """
        from chute._src.iter.batch_by_tokens import BatchByTokensIterDataset

        return BatchByTokensIterDataset(
            self,
            max_tokens,
            length_fn=length_fn,
            max_batch_size=max_batch_size,
            pad_to_multiple_of=pad_to_multiple_of,
            drop_remainder=drop_remainder,
            window_size=window_size,
            sort=sort,
            seed=seed,
            pad_value=pad_value,
            batch_fn=batch_fn,
        )

    def bucket_by_sequence_length(
        self,
        element_length_func: Callable[[T], int],
        bucket_boundaries: Sequence[int],
        bucket_batch_sizes: Sequence[int],
        *,
        pad_to_bucket_boundary: bool = False,
        pad_value: Any = 0,
        batch_fn: Callable[[list[T]], Any] | None = None,
        drop_remainder: bool = False,
        window_size: int | None = None,
    ) -> IterDataset[Any]:
        """tf.data's length buckets: an element of length `n` joins the bucket of
        `bucket_boundaries[b-1] <= n < bucket_boundaries[b]`, batched by
        `bucket_batch_sizes[b]`. Buckets close at the end of each window of `window_size`
        elements (default 16 x the sum of the batch sizes), so the state stays small.
        `experimental.BucketBySequenceLengthIterDataset`; docs/sequences.md.
        """
        from chute._src.iter.bucket_by_length import BucketBySequenceLengthIterDataset

        return BucketBySequenceLengthIterDataset(
            self,
            element_length_func,
            bucket_boundaries,
            bucket_batch_sizes,
            pad_to_bucket_boundary=pad_to_bucket_boundary,
            pad_value=pad_value,
            batch_fn=batch_fn,
            drop_remainder=drop_remainder,
            window_size=window_size,
        )

    def even_batches(
        self, num_batches: int, *, pad: Callable[[Any], Any] | None = None
    ) -> IterDataset[Any]:
        """Exactly `num_batches` elements per pass, the same count on every shard so that
        data-parallel ranks step together: without `pad`, the first `num_batches` (the
        smallest count over shards; the tail is dropped); with `pad`, a short shard adds
        `pad(last_batch)` (e.g. `experimental.zeros_like_batch`; the largest count).
        A shard that breaks the rule raises. `experimental.EvenBatchesIterDataset`.
        """
        from chute._src.iter.even_batches import EvenBatchesIterDataset

        return EvenBatchesIterDataset(self, num_batches, pad=pad)

    def repeat(self, num_epochs: int | None = None) -> IterDataset[T]:
        """Repeats the stream `num_epochs` times (forever with None); epochs are identical."""
        from chute._src.iter.repeat import RepeatIterDataset

        return RepeatIterDataset(self, num_epochs)

    def limit(self, count: int) -> IterDataset[T]:
        """The first `count` elements."""
        from chute._src.iter.limit import LimitIterDataset

        return LimitIterDataset(self, count)

    def cache(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> IterDataset[T]:
        """Caches the stream: in memory, or with `path` in record files under `path`.

        The first full pass is kept; passes that start again from the beginning (a
        `repeat` after it, or a later run for a disk cache) read the cache instead of
        computing the pipeline above. A disk cache is keyed by that pipeline, so a
        changed pipeline builds its own. `path` may be a URL (`s3://...`, with
        `storage_options` for fsspec; `docs/remote.md`).
        """
        if path is None:
            from chute._src.iter.cache import CacheIterDataset

            return CacheIterDataset(self)
        from chute._src.iter.disk_cache import DiskCacheIterDataset

        return DiskCacheIterDataset(self, path, storage_options=storage_options)

    def mp_prefetch(
        self,
        options: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], None] | None = None,
        sequential_slice: bool = False,
    ) -> IterDataset[T]:
        """Computes the pipeline in worker processes; the output is the same for any count.

        `worker_init_fn(worker_index, worker_count)` runs once in each worker. Workers
        never run the main script: what it defines reaches them by value (cloudpickle),
        so no `if __name__ == "__main__":` guard is needed.
        A worker that produces nothing for `options.stall_warning_s` (default 300 s) gets
        a `chute.multiprocessing.WorkerStallWarning` with its Python stack and the element
        indices it computes; with `options.timeout_s` (default None: wait) the wait ends in
        a `WorkerTimeoutError` instead. A worker's exception is raised here with its
        traceback and element index.
        `sequential_slice` is Grain's (workers read contiguous slices rather than strided
        ones, which changes Grain's order); chute's workers always compute contiguous
        chunks and the output is in index order, so it changes nothing here.
        """
        from chute._src.iter.mp_prefetch import MultiprocessPrefetchIterDataset

        return MultiprocessPrefetchIterDataset(self, options, worker_init_fn, sequential_slice)

    def prefetch(
        self, multiprocessing_options: MultiprocessingOptions | int | Any
    ) -> IterDataset[T]:
        """Computes ahead of the consumer: with `MultiprocessingOptions`, in worker
        processes (`mp_prefetch`, Grain's older name, whose parameter name it keeps); with
        an int `n` or `chute.AUTOTUNE` (tf.data's habit), `n` elements (AUTOTUNE: 2) in a
        background thread (`experimental.ThreadPrefetchIterDataset`)."""
        from chute._src.iter.prefetch_buffer import prefetch

        return prefetch(self, multiprocessing_options)

    def seed(self, seed: int) -> IterDataset[T]:
        """Sets the seed that random stages after this point derive their seeds from."""
        from chute._src.iter.seed import SeedIterDataset

        return SeedIterDataset(self, seed)

    def pipe(
        self,
        func: Callable[Concatenate[IterDataset[T], P], S],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> S:
        """`func(self, *args, **kwargs)`: lets a function take part in a method chain."""
        return func(self, *args, **kwargs)

    def apply(self, transformations: Any) -> IterDataset[Any]:
        """Applies one transform object or a sequence of them, each by its kind (`Batch`
        as `batch`, `MapTransform` as `map`, ...): `experimental.apply_transformations`."""
        from chute._src.apply import apply_transformations

        return apply_transformations(self, transformations)
