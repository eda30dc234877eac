"""Samplers for the DataLoader API."""

from chute._src.frameworks.sampler_protocol import Sampler as Sampler
from chute._src.frameworks.samplers import IndexSampler as IndexSampler
from chute._src.frameworks.samplers import RecordMetadata as RecordMetadata
from chute._src.frameworks.samplers import SequentialSampler as SequentialSampler

__all__ = [
    "IndexSampler",
    "RecordMetadata",
    "Sampler",
    "SequentialSampler",
]
