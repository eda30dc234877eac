"""`IterDataset`: a lazy iterable dataset, and its chain methods (each a thin constructor
of a named class in `ops/`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    TypeVar,
    cast,
    overload,
)

import numpy as np

from chute._src.core import observe, set_slice
from chute._src.core.iterator import ThreadGuardedIterator
from chute._src.core.node import _Node

if TYPE_CHECKING:
    from chute._src.core.iterator import DatasetIterator
    from chute._src.core.map_dataset import MapDataset
    from chute._src.core.options import MultiprocessingOptions
    from chute._src.core.transforms import (
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


class IterDataset(_Node, Generic[T]):
    """A lazy iterable dataset; `iter(ds)` gives a checkpointable `DatasetIterator`.

    >>> import chute
    >>> ds = chute.MapDataset.range(6).to_iter_dataset().filter(lambda x: x % 2).batch(2)
    >>> [b.tolist() for b in ds]
    [[1, 3], [5]]
    """

    _slices_in_place: bool = False
    """True for a dataset with Grain's `set_slice`, which changes it in place
    (`core/set_slice.py`): the stages built on it are tracked, to refuse it after them."""

    def __init__(self, parents: _Node | Sequence[_Node] = ()) -> None:
        super().__init__(parents)
        set_slice.note_parents(self, self._parents)

    def __iter__(self) -> DatasetIterator[T]:
        """A fresh iterator, positioned at the start, for one thread at a time."""
        it = ThreadGuardedIterator(self._iter())
        it.iterated = self
        return it

    def _iter(self) -> DatasetIterator[T]:
        """`iter(self)` without the thread guard: what stages iterate their parents with."""
        observer = observe.observing()  # debug mode: see `_src/core/observe.py`
        if observer is not None:
            return observer.iterator(self, self._described_iterator)
        return self._described_iterator()

    def _described_iterator(self) -> DatasetIterator[T]:
        """`_make_iterator()`, its state recording this stage's position-fixing parameters
        (`_fingerprint_params`, as the state's "params")."""
        it = self._make_iterator()
        params = self._fingerprint_params()
        if params and not it.stage_params:
            it.stage_params = params
        return it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A stage written as in Grain (`__iter__` returning its iterator, no
        `_make_iterator`) is adapted here, once, when its class is made: its `__iter__`
        becomes its `_make_iterator`, and `iter(ds)` adds the thread guard as for any stage."""
        super().__init_subclass__(**kwargs)
        if "__iter__" in cls.__dict__ and "_make_iterator" not in cls.__dict__:
            cls._make_iterator = cls.__dict__["__iter__"]  # type: ignore[method-assign]
            cls.__iter__ = IterDataset.__iter__  # type: ignore[method-assign]
        cls._unimplemented = (
            "__iter__" if cls._make_iterator is IterDataset._make_iterator else None
        )

    def _make_iterator(self) -> DatasetIterator[T]:
        """A fresh iterator of this stage, reading fresh iterators of its parents
        (`self._parent_iter(i)`). Every stage implements it (or `__iter__`, as in Grain:
        see `__init_subclass__`); `iter(ds)` adds the thread guard (and the timing of debug
        mode) around it. A class with neither cannot be instantiated (`_Node.__init__`)."""
        raise self._unimplemented_error()  # a subclass that skipped _Node.__init__

    def _parent_iter(self, i: int = 0) -> DatasetIterator[Any]:
        """A fresh iterator of parent `i`."""
        return cast("IterDataset[Any]", self._parents[i])._iter()

    def _as_map_stage(self, parent: MapDataset[Any]) -> MapDataset[Any]:
        """For an `ELEMENT_WISE` stage: the same operation as a MapDataset stage on `parent`."""
        raise NotImplementedError(
            f"{self!r} is not element-wise (its role is {self._role}); only ELEMENT_WISE "
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
        from chute._src.ops.iterable_source import IterableSourceIterDataset

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
        from chute._src.ops.mix import MixedIterDataset

        return MixedIterDataset(datasets, weights, step_size=step_size)

    @overload
    def map(self, transform: SupportsMap[T, S]) -> IterDataset[S]: ...

    @overload
    def map(self, transform: Callable[[T], S]) -> IterDataset[S]: ...

    def map(self, transform: SupportsMap[T, S] | Callable[[T], S]) -> IterDataset[S]:
        """Applies `transform` (a function or a `MapTransform`) to every element."""
        from chute._src.ops.map import MapIterDataset

        return MapIterDataset(self, transform)

    @overload
    def map_with_index(self, transform: SupportsMapWithIndex[T, S]) -> IterDataset[S]: ...

    @overload
    def map_with_index(self, transform: Callable[[int, T], S]) -> IterDataset[S]: ...

    def map_with_index(
        self, transform: SupportsMapWithIndex[T, S] | Callable[[int, T], S]
    ) -> IterDataset[S]:
        """Applies `transform(index, element)`, index counting this stage's inputs."""
        from chute._src.ops.map import MapWithIndexIterDataset

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
        from chute._src.ops.random_map import RandomMapIterDataset

        return RandomMapIterDataset(self, transform, seed=seed)

    def filter(self, transform: SupportsFilter[T] | Callable[[T], object]) -> IterDataset[T]:
        """Keeps the elements for which `transform` (a function or `FilterTransform`) is true."""
        from chute._src.ops.filter import FilterIterDataset

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
        from chute._src.ops.batch import BatchIterDataset
        from chute._src.ops.pad_batch import batch_fn_with_padding

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
        from chute._src.ops.batch_by_tokens import BatchByTokensIterDataset

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
        `bucket_batch_sizes[b]`. As in tf.data, the buckets stay open across the stream: only
        the final remainder is short (`drop_remainder` drops it). `window_size`, if given,
        bounds how many input elements an element waits. The state stays a few integers.
        `experimental.BucketBySequenceLengthIterDataset`; docs/sequences.md.
        """
        from chute._src.ops.bucket_by_length import BucketBySequenceLengthIterDataset

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
        from chute._src.ops.even_batches import EvenBatchesIterDataset

        return EvenBatchesIterDataset(self, num_batches, pad=pad)

    def repeat(self, num_epochs: int | None = None) -> IterDataset[T]:
        """Repeats the stream `num_epochs` times (forever with None); epochs are identical."""
        from chute._src.ops.repeat import RepeatIterDataset

        return RepeatIterDataset(self, num_epochs)

    def limit(self, count: int) -> IterDataset[T]:
        """The first `count` elements."""
        from chute._src.ops.limit import LimitIterDataset

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
            from chute._src.ops.cache import CacheIterDataset

            return CacheIterDataset(self)
        from chute._src.ops.disk_cache import DiskCacheIterDataset

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
        `sequential_slice=True` asks for Grain's order with that many workers: each reads a
        contiguous share of the data and their outputs alternate (10 elements over 3
        workers: 0, 4, 7, 1, 5, 8, 2, 6, 9, 3); the order then depends on
        `options.num_workers`, and only on it.
        An `mp_prefetch` in the input of another with workers hands its input on: the
        outer one runs the whole pipeline below it in its own workers.
        """
        from chute._src.exec.workers.stage import MultiprocessPrefetchIterDataset

        return MultiprocessPrefetchIterDataset(self, options, worker_init_fn, sequential_slice)

    def prefetch(
        self, multiprocessing_options: MultiprocessingOptions | int | Any
    ) -> IterDataset[T]:
        """Computes ahead of the consumer: with `MultiprocessingOptions`, in worker
        processes (`mp_prefetch`, Grain's older name, whose parameter name it keeps); with
        an int `n` or `chute.AUTOTUNE` (tf.data's habit), `n` elements (AUTOTUNE: 2) in a
        background thread (`experimental.ThreadPrefetchIterDataset`)."""
        from chute._src.exec.thread_prefetch import prefetch

        return prefetch(self, multiprocessing_options)

    def seed(self, seed: int) -> IterDataset[T]:
        """Sets the seed that random stages after this point derive their seeds from."""
        from chute._src.ops.seed import SeedIterDataset

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
        from chute._src.ops.apply import apply_transformations

        return apply_transformations(self, transformations)
