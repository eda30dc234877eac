"""`Sampler`: what the DataLoader asks of a sampler."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from chute._src.frameworks.samplers import RecordMetadata


@runtime_checkable
class Sampler(Protocol):
    """`__getitem__(index)` gives the `RecordMetadata` of step `index` (its record key and
    rng); the DataLoader reads steps `0, 1, 2, ...`."""

    def __getitem__(self, index: int) -> RecordMetadata: ...
