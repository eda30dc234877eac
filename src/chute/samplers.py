"""Samplers for the DataLoader API."""

from chute._src.sampler_protocol import Sampler as Sampler
from chute._src.samplers import IndexSampler as IndexSampler
from chute._src.samplers import RecordMetadata as RecordMetadata
from chute._src.samplers import SequentialSampler as SequentialSampler

__all__ = [
    "IndexSampler",
    "RecordMetadata",
    "Sampler",
    "SequentialSampler",
]
