"""The DataLoader's operations API: `MapOperation`, `FilterOperation`, ... .

Each operation is also the transform that does the same job (`MapOperation` is a
`MapTransform`, `BatchOperation` a `Batch`), so a `DataLoader` given operations builds the
same stages as one given transforms, and its output does not depend on the worker count.
Called on an iterator of `Record`s, an operation yields the transformed records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from chute._src.core import tree
from chute._src.core.transforms import (
    Batch,
    FilterTransform,
    MapTransform,
    RandomMapTransform,
    as_batch_fn,
)
from chute._src.frameworks.record import Record
from chute._src.frameworks.samplers import RecordMetadata
from chute._src.ops.packing.pack_and_batch import Layout, PackedBatch, check_batch_args


class Operation(Protocol):
    """A function from an iterator of records to an iterator of records."""

    def __call__(self, input_iterator: Iterator[Record[Any]]) -> Iterator[Record[Any]]: ...


def _meta(record: Record[Any]) -> RecordMetadata:
    return record.metadata.remove_record_key()


@dataclasses.dataclass
class MapOperation(MapTransform[Any, Any]):
    """`map_function(element)` for every element.

    >>> import chute
    >>> ds = chute.MapDataset.range(3).map(MapOperation(lambda x: x + 1))
    >>> list(ds)
    [1, 2, 3]
    """

    map_function: Callable[[Any], Any]

    def map(self, element: Any) -> Any:
        return self.map_function(element)

    def __call__(self, input_iterator: Iterator[Record[Any]]) -> Iterator[Record[Any]]:
        for record in input_iterator:
            yield Record(_meta(record), self.map_function(record.data))


@dataclasses.dataclass
class RandomMapOperation(RandomMapTransform[Any, Any]):
    """`random_map_function(element, rng)` for every element."""

    random_map_function: Callable[[Any, np.random.Generator], Any]

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        return self.random_map_function(element, rng)

    def __call__(self, input_iterator: Iterator[Record[Any]]) -> Iterator[Record[Any]]:
        for record in input_iterator:
            rng = record.metadata.rng
            if rng is None:
                raise ValueError(
                    f"RandomMapOperation: record {record.metadata.index} has no rng: give the "
                    "sampler a seed (IndexSampler(..., seed=42))."
                )
            yield Record(_meta(record), self.random_map_function(record.data, rng))


@dataclasses.dataclass
class FilterOperation(FilterTransform[Any]):
    """Keeps the elements for which `condition_function(element)` is true."""

    condition_function: Callable[[Any], bool]

    def filter(self, element: Any) -> bool:
        return bool(self.condition_function(element))

    def __call__(self, input_iterator: Iterator[Record[Any]]) -> Iterator[Record[Any]]:
        for record in input_iterator:
            if self.condition_function(record.data):
                yield Record(_meta(record), record.data)


@dataclasses.dataclass(frozen=True)
class BatchOperation(Batch):
    """Batches of `batch_size` elements, stacked leaf by leaf (or by `batch_fn`).

    Without a `batch_fn` it stacks as Grain's does (`stack_records`): elements of another
    structure raise `TypeError`, and a leaf that is neither an array nor a number nor a
    dict, list or tuple (a dataclass, say) is one item of an object array.

    >>> import chute
    >>> [b.tolist() for b in chute.MapDataset.range(5).apply(BatchOperation(2))]
    [[0, 1], [2, 3], [4]]
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_fn is None:
            object.__setattr__(self, "batch_fn", stack_records)

    def __call__(self, input_iterator: Iterator[Record[Any]]) -> Iterator[Record[Any]]:
        batch_fn = as_batch_fn(self.batch_fn)
        pending: list[Any] = []
        last: Record[Any] | None = None
        for record in input_iterator:
            last = record
            pending.append(record.data)
            if len(pending) == self.batch_size:
                yield Record(_meta(record), batch_fn(pending))
                pending = []
        if pending and not self.drop_remainder and last is not None:
            yield Record(_meta(last), batch_fn(pending))

    def disable_deprecation_message(self) -> None:
        """Accepted for compatibility: chute logs no deprecation message."""


def _structure(x: Any) -> Any:
    """What Grain's pytrees see of `x`: dicts (by key), lists, tuples and namedtuples are
    nodes, None is empty, anything else is a leaf."""
    if isinstance(x, dict):
        return (dict, tuple((k, _structure(x[k])) for k in sorted(x, key=repr)))
    if isinstance(x, list | tuple):
        return (type(x) if hasattr(x, "_fields") else type(x).__name__, tuple(map(_structure, x)))
    return None if x is None else "leaf"


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, dict):
        return type(first)((k, _stack([v[k] for v in values])) for k in first)
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_stack([v[i] for v in values]) for i in range(len(first))))
    if isinstance(first, list | tuple):
        return type(first)(_stack([v[i] for v in values]) for i in range(len(first)))
    if first is None:
        return None
    if isinstance(first, np.ndarray | np.generic | int | float | complex | bool | str | bytes):
        return tree.stack(values)
    return np.stack(values)  # objects (a dataclass, ...): an object array, as Grain's


def stack_records(records: Sequence[Any]) -> Any:
    """`BatchOperation`'s stacking, as Grain's: `records` must share one structure (dicts,
    lists, tuples); their leaves are stacked into arrays.

    >>> stack_records([{"a": 1, "b": [2, 3]}, {"a": 4, "b": [5, 6]}])
    {'a': array([1, 4]), 'b': [array([2, 5]), array([3, 6])]}
    """
    first = _structure(records[0])
    bad = [i for i, r in enumerate(records) if i and _structure(r) != first]
    if bad:
        raise TypeError(
            "Record structures do not match. Record at position 0 has structure "
            f"{records[0]}, while records at positions {bad} have structures "
            f"{[records[i] for i in bad]}. The records of a batch need the same structure "
            "(dict keys, list lengths): make the operations before it give every record "
            "the same, or pass batch_fn= to combine them."
        )
    return _stack(list(records))


@dataclasses.dataclass
class PackAndBatchOperation:
    """Grain's older packer: sequences packed into the rows of batches of `batch_size`
    rows (`length_struct` gives each feature's row length), each sequence in the first
    row it fits, a batch emitted when a sequence fits none of its rows. A batch is
    `(data, segmentations, positions)`, each shaped like `length_struct`
    (`ops/packing/pack_and_batch.py`). Among a `DataLoader`'s operations it packs the
    stream of records; called on an iterator of `Record`s it yields packed `Record`s,
    each with the metadata of its last sequence. `experimental.FirstFitPackIterDataset`
    is the Dataset API's packer (rows one at a time, with segment ids in the element).

    >>> import chute
    >>> op = PackAndBatchOperation(length_struct={"t": 4}, batch_size=2)
    >>> records = [Record(RecordMetadata(index=i), {"t": t}) for i, t in
    ...            enumerate([[1, 2, 3], [4], [5, 6]])]
    >>> (packed,) = op(iter(records))
    >>> packed.metadata.index, packed.data[0]["t"].tolist()
    (2, [[1, 2, 3, 4], [5, 6, 0, 0]])
    """

    length_struct: Any
    batch_size: int
    max_sequences_per_bin: int | None = None
    # Grain's field for the batch its `__call__` is filling; chute's keeps that batch to
    # itself, so it stays None.
    _cur_batch: None = None

    def __post_init__(self) -> None:
        check_batch_args(self.batch_size, self.max_sequences_per_bin)
        Layout(self.length_struct)  # checks it
        if self._cur_batch is not None:
            raise ValueError(
                f"PackAndBatchOperation: _cur_batch={self._cur_batch!r} is invalid: it is "
                "the batch being filled, which the operation keeps itself; leave it None."
            )

    def __call__(self, input_iterator: Iterator[Record[Any]]) -> Iterator[Record[Any]]:
        layout = Layout(self.length_struct)
        batch: PackedBatch | None = None
        last: Record[Any] | None = None
        for index, record in enumerate(input_iterator):
            leaves = layout.leaves(record.data, index)
            if batch is None:
                batch = PackedBatch(leaves, layout, self.batch_size, self.max_sequences_per_bin)
            if not batch.try_add(leaves, index):
                assert last is not None  # a batch holds at least one sequence
                yield Record(_meta(last), batch.result())
                batch = PackedBatch(leaves, layout, self.batch_size, self.max_sequences_per_bin)
                batch.try_add(leaves, index)
            last = record
        if batch is not None and last is not None:
            yield Record(_meta(last), batch.result())
