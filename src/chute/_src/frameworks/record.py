"""`Record`: an element with the metadata the DataLoader's sampler gave it."""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

from chute._src.frameworks.samplers import RecordMetadata

T = TypeVar("T")


@dataclasses.dataclass(slots=True)
class Record(Generic[T]):
    """`data` with its `metadata` (index, record key, rng), as operations see it.

    >>> Record(RecordMetadata(index=0, record_key=3), "x").data
    'x'
    """

    metadata: RecordMetadata
    data: T
