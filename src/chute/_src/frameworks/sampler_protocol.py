"""`Sampler`: what the DataLoader asks of a sampler."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from chute._src.frameworks.samplers import RecordMetadata


@runtime_checkable
class Sampler(Protocol):
    """`__getitem__(index)` gives the `RecordMetadata` of step `index` (its record key and
    rng); the DataLoader reads steps `0, 1, 2, ...`.

    Its `record_key` is the index of the record the step reads in the data source: an int,
    which `chute.experimental.provenance` reports as the record's `index` (with the step as
    `sampler_index`; `epoch` None, the sampler's own passes being its own). `skip` moves
    by steps, in O(1)."""

    def __getitem__(self, index: int) -> RecordMetadata: ...
