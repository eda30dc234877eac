"""Stages whose API may still change: prefetching, packing, mixing, interleaving, caching."""

from chute._src.iter.concat_split import BOSHandling as BOSHandling
from chute._src.iter.concat_split import (
    ConcatThenSplitIterDataset as ConcatThenSplitIterDataset,
)
from chute._src.iter.pack_best_fit import BestFitPackIterDataset as BestFitPackIterDataset
from chute._src.iter.pack_first_fit import FirstFitPackIterDataset as FirstFitPackIterDataset
from chute._src.iter.rebatch import RebatchIterDataset as RebatchIterDataset
from chute._src.iter.thread_prefetch import (
    ThreadPrefetchIterDataset as ThreadPrefetchIterDataset,
)
from chute._src.options import MultiprocessingOptions as MultiprocessingOptions

__all__ = [
    "BOSHandling",
    "BestFitPackIterDataset",
    "ConcatThenSplitIterDataset",
    "FirstFitPackIterDataset",
    "MultiprocessingOptions",
    "RebatchIterDataset",
    "ThreadPrefetchIterDataset",
]
