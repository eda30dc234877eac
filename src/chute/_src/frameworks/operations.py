"""The DataLoader's operations API: `MapOperation`, `FilterOperation`, ... .

Each operation is also the transform that does the same job (`MapOperation` is a
`MapTransform`, `BatchOperation` a `Batch`), so a `DataLoader` given operations builds the
same stages as one given transforms, and its output does not depend on the worker count.
Called on an iterator of `Record`s, an operation yields the transformed records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from chute._src.core.transforms import (
    Batch,
    FilterTransform,
    MapTransform,
    RandomMapTransform,
    as_batch_fn,
)
from chute._src.frameworks.record import Record
from chute._src.frameworks.samplers import RecordMetadata


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

    >>> import chute
    >>> [b.tolist() for b in chute.MapDataset.range(5).apply(BatchOperation(2))]
    [[0, 1], [2, 3], [4]]
    """

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
