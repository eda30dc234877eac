"""Stages whose API may still change: prefetching, packing, mixing, interleaving, caching."""

from chute._src.iter.thread_prefetch import (
    ThreadPrefetchIterDataset as ThreadPrefetchIterDataset,
)
from chute._src.options import MultiprocessingOptions as MultiprocessingOptions

__all__ = ["MultiprocessingOptions", "ThreadPrefetchIterDataset"]
