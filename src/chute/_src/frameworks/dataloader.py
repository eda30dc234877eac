"""The DataLoader API: data source + sampler + operations.

A thin layer: it translates its arguments into a Dataset pipeline and iterates that, so
both APIs share one engine, one state format and one set of guarantees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chute._src.core.dataset import SEED_TAG_RANDOM_MAP, IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator, concurrent_next_error, one_token
from chute._src.core.options import MultiprocessingOptions, ReadOptions
from chute._src.core.provenance import ProvenanceError
from chute._src.core.seeding import derive_seed
from chute._src.core.state_checks import seal
from chute._src.frameworks.operations import PackAndBatchOperation
from chute._src.frameworks.samplers import IndexSampler
from chute._src.frameworks.sharding import NoSharding, ShardOptions
from chute._src.ops.apply import Kind, apply_transform, transform_kind
from chute._src.ops.packing.pack_and_batch import PackAndBatchIterDataset


class DataLoader:
    """Reads `data_source` in the order of `sampler` and applies `operations`.

    `worker_count=N` computes the records in N worker processes; the batches are the same
    for every N (0 computes in this process), and so are the iterator states: a state taken
    with any `worker_count` and thread count restores with any other, 0 included (it is the
    state of `loader.dataset`'s iterator). It restores only into a loader with the same
    source length, sampler (seed, shuffle, epochs, sharding) and batch sizes, raising
    `CheckpointError` naming the first difference; the operations' functions may change.
    `worker_stall_warning_s` and `worker_timeout_s` are `MultiprocessingOptions`'
    `stall_warning_s` and `timeout_s`: a warning showing the stack of a worker that has
    produced nothing for that long (default 300 s), and an error after that long
    (default: none). `enable_profiling=True` prints the execution summary (per-stage
    times, the bottleneck, advice) when the iterator ends, with any `worker_count`.
    `multiprocessing_options` gives the worker options whole instead (with
    `chute.ray.RayWorkers(...)`, the workers are actors of a Ray cluster); then the
    `worker_*` arguments are left out.

    >>> import chute
    >>> loader = chute.DataLoader(
    ...     data_source=chute.sources.RangeDataSource(0, 10, 1),
    ...     sampler=chute.IndexSampler(10, shuffle=True, seed=0, num_epochs=1),
    ...     operations=[chute.Batch(batch_size=4)],
    ... )
    >>> [b.tolist() for b in loader]
    [[8, 6, 4, 1], [7, 3, 9, 2], [5, 0]]
    """

    def __init__(
        self,
        *,
        data_source: Any,
        sampler: Any,
        operations: Sequence[Any] = (),
        worker_count: int | None = 0,
        worker_buffer_size: int = 1,
        shard_options: ShardOptions | None = None,
        read_options: ReadOptions | None = None,
        num_threads: int | None = None,
        enable_profiling: bool = False,
        worker_init_fn: Callable[[int, int], None] | None = None,
        worker_stall_warning_s: float | None = 300.0,
        worker_timeout_s: float | None = None,
        multiprocessing_options: MultiprocessingOptions | None = None,
    ) -> None:
        if worker_count is None:
            worker_count = 0
        if isinstance(worker_count, bool) or not isinstance(worker_count, int) or worker_count < 0:
            raise ValueError(
                f"DataLoader: worker_count={worker_count!r} is invalid: it must be an int >= 0."
            )
        if num_threads is not None:
            if read_options is not None:
                raise ValueError(
                    "DataLoader: both num_threads and read_options were given: pass one; "
                    "num_threads=N is short for read_options=ReadOptions(num_threads=N)."
                )
            read_options = ReadOptions(num_threads=num_threads)
        self._sampler = _with_shard_options(sampler, shard_options)
        self._data_source = data_source
        self._operations = list(operations)
        self._read_options = read_options or ReadOptions()
        self._worker_count = worker_count
        self._worker_init_fn = worker_init_fn
        self._worker_options = MultiprocessingOptions(  # checked here, before iterating
            num_workers=worker_count,
            per_worker_buffer_size=max(1, worker_buffer_size),
            stall_warning_s=worker_stall_warning_s,
            timeout_s=worker_timeout_s,
            enable_profiling=enable_profiling,
        )
        if multiprocessing_options is not None:
            if not isinstance(multiprocessing_options, MultiprocessingOptions):
                raise TypeError(
                    f"DataLoader: multiprocessing_options={multiprocessing_options!r} is not "
                    "a MultiprocessingOptions: pass chute.MultiprocessingOptions(num_workers=N) "
                    "or chute.ray.RayWorkers(N)."
                )
            if worker_count or worker_buffer_size != 1:
                raise ValueError(
                    "DataLoader: both worker_count/worker_buffer_size and "
                    "multiprocessing_options were given: pass one (num_workers and "
                    "per_worker_buffer_size are in the options)."
                )
            self._worker_options = multiprocessing_options
            enable_profiling = enable_profiling or multiprocessing_options.enable_profiling
        self._enable_profiling = enable_profiling
        self._dataset = self._build()

    @property
    def dataset(self) -> IterDataset[Any]:
        """The Dataset pipeline this loader iterates."""
        return self._dataset

    @property
    def multiprocessing_options(self) -> MultiprocessingOptions:
        """The worker options this loader runs with (from `worker_count` and the others)."""
        return self._worker_options

    def _build(self) -> IterDataset[Any]:
        ds: MapDataset[Any] = MapDataset.source(self._data_source)
        sampler = self._sampler
        if isinstance(sampler, IndexSampler):
            ds = sampler.apply(ds)
        else:
            ds = MapDataset.range(len(sampler)).map(_SamplerKey(sampler)).map(_Read(ds))
        seed = getattr(sampler, "seed", None)
        it: IterDataset[Any] | None = None
        filtered = False
        for position, op in enumerate(self._operations):
            if isinstance(op, PackAndBatchOperation):  # packs the stream of records
                if it is None:
                    it = ds.to_iter_dataset(self._read_options)
                it = PackAndBatchIterDataset(
                    it,
                    length_struct=op.length_struct,
                    batch_size=op.batch_size,
                    max_sequences_per_bin=op.max_sequences_per_bin,
                )
                continue
            kind = transform_kind(op)
            if kind is None:
                if not callable(op):
                    raise _bad_operation(op, position)
                kind = Kind.MAP  # a plain function
            if kind is Kind.BATCH:
                if it is None and not filtered:
                    ds = apply_transform(ds, op, kind)
                    continue
                if it is None:  # full batches after a filter are formed while iterating
                    it = ds.to_iter_dataset(self._read_options)
                it = apply_transform(it, op, kind)
                continue
            op_seed = None
            if kind is Kind.RANDOM_MAP:
                if seed is None:
                    raise ValueError(
                        f"DataLoader: operation {position} ({type(op).__name__}) is random, but "
                        "the sampler has no seed: pass seed=42 to the sampler, e.g. "
                        "IndexSampler(..., seed=42)."
                    )
                op_seed = derive_seed(seed, SEED_TAG_RANDOM_MAP, position)
            # A filter or a flat map leaves some positions empty: batches formed after it
            # are formed while iterating, to be full.
            filtered = filtered or kind in (Kind.FILTER, Kind.FLAT_MAP)
            if kind is Kind.FLAT_MAP and it is None:
                # Grain's DataLoader takes a FlatMap among its operations: with a
                # `max_fan_out`, on the MapDataset (element i owns positions
                # [i * max_fan_out, (i + 1) * max_fan_out), so workers still compute it);
                # without one, on the stream.
                fan = getattr(op, "max_fan_out", None)
                if not isinstance(fan, int) or isinstance(fan, bool):
                    it = ds.to_iter_dataset(self._read_options)
            if it is None:
                ds = apply_transform(ds, op, kind, seed=op_seed)
            else:
                it = apply_transform(it, op, kind, seed=op_seed)
        if it is None:
            it = ds.to_iter_dataset(self._read_options)
        # With any worker count, 0 included (a pass-through then), so that the pipeline,
        # and the stages its figures list, are the same whatever the count.
        return it.mp_prefetch(self._worker_options, self._worker_init_fn)

    def _name_records(self, steps: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
        """`provenance`'s records as this loader reads them. An `IndexSampler` is Dataset
        stages over the source, whose records name themselves; a sampler of the user's is
        read by its steps (`range(len(sampler))`), so each record found is a step, named
        here by the record key the sampler gives it: `index` is that key, `sampler_index`
        the step and `epoch` None (the sampler's own epochs, if any, are not known)."""
        if isinstance(self._sampler, IndexSampler):
            return steps
        return [[self._sampler_record(r) for r in step] for step in steps]

    def _sampler_record(self, record: dict[str, Any]) -> dict[str, Any]:
        step = record["index"]
        meta = self._sampler[step]
        key = getattr(meta, "record_key", None)
        if isinstance(key, bool) or not isinstance(key, int | np.integer):
            raise ProvenanceError(
                f"provenance: the sampler {self._sampler!r} gave {meta!r} for step {step}, "
                f"whose record_key {key!r} is not a record index: a sampler declares the "
                "record each step reads as RecordMetadata(index=step, record_key=int), "
                "which the DataLoader reads and provenance names."
            )
        return {**record, "index": int(key), "epoch": None, "sampler_index": step}

    def __iter__(self) -> DataLoaderIterator:
        it = DataLoaderIterator(self._dataset._iter())
        it.iterated = self
        return it

    def __repr__(self) -> str:
        return (
            f"DataLoader(data_source={type(self._data_source).__name__}, "
            f"sampler={self._sampler!r}, operations={self._operations!r})"
        )


class DataLoaderIterator(DatasetIterator[Any]):
    """The iterator of a `DataLoader`: `next`, `get_state`, `set_state`.

    For one thread at a time: `next` from a second thread while one is running raises
    `RuntimeError` (see `ThreadGuardedIterator`). Its state is that of `loader.dataset`'s
    iterator, sealed with the same checksum: the two APIs share one state format.
    """

    stage = "data_loader"
    transparent = True

    def __init__(self, parent: DatasetIterator[Any]) -> None:
        super().__init__(parent)
        self._take, self._give = one_token()
        self._next = parent.__next__

    def __next__(self) -> Any:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self) from None
        try:
            return self._next()
        finally:
            self._give(None)

    def _next_many(self, n: int) -> list[Any]:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self) from None
        try:
            return self._parent._next_many(n)
        finally:
            self._give(None)

    def get_state(self) -> dict[str, Any]:
        # `set_state` (DatasetIterator's) checks the checksum and takes it off.
        # Caught up: changes made between steps are recorded (`DatasetIterator._catch_up`).
        state: dict[str, Any] = seal(self._catch_up(super().get_state()))
        return state


def _with_shard_options(sampler: Any, shard_options: ShardOptions | None) -> Any:
    if not (hasattr(sampler, "__len__") and hasattr(sampler, "__getitem__")):
        raise TypeError(
            f"DataLoader: sampler={sampler!r} is not a sampler: it needs __len__ and "
            "__getitem__ returning RecordMetadata; use chute.IndexSampler(...)."
        )
    if shard_options is None or isinstance(shard_options, NoSharding):
        return sampler
    if not isinstance(sampler, IndexSampler):
        raise ValueError(
            f"DataLoader: shard_options={shard_options!r} can only be applied to an "
            f"IndexSampler or SequentialSampler, not {type(sampler).__name__}: shard inside "
            "your sampler instead."
        )
    own = sampler.shard_options
    if not isinstance(own, NoSharding) and own != shard_options:
        raise ValueError(
            f"DataLoader: shard_options={shard_options!r} conflicts with the sampler's "
            f"{own!r}: give shard options in one place only."
        )
    return sampler.with_shard_options(shard_options)


def _bad_operation(op: Any, position: int) -> TypeError:
    return TypeError(
        f"DataLoader: operation {position}, {op!r} of type {type(op).__name__}, is not an "
        "operation: use a MapTransform, RandomMapTransform, FilterTransform, MapWithIndex, "
        "FlatMapTransform, Batch, PackAndBatchOperation or a plain function."
    )


class _SamplerKey:
    """Picklable `i -> sampler[i].record_key`, for samplers that are not an IndexSampler."""

    def __init__(self, sampler: Any) -> None:
        self._sampler = sampler

    def __call__(self, index: int) -> Any:
        return self._sampler[index].record_key


class _Read:
    """Picklable `key -> source[key]` over a source `MapDataset`."""

    def __init__(self, source: MapDataset[Any]) -> None:
        self._source = source

    def __call__(self, key: int) -> Any:
        return self._source[key]
