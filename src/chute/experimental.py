"""Stages whose API may still change: prefetching, packing, mixing, interleaving, caching,
and the `ElasticIterator` (global batches resumable with another host count)."""

from chute._src.elastic import ElasticIterator as ElasticIterator
from chute._src.iter.cache import CacheIterDataset as CacheIterDataset
from chute._src.iter.concat_split import BOSHandling as BOSHandling
from chute._src.iter.concat_split import (
    ConcatThenSplitIterDataset as ConcatThenSplitIterDataset,
)
from chute._src.iter.disk_cache import DiskCacheIterDataset as DiskCacheIterDataset
from chute._src.iter.file_stream import FileLinesIterDataset as FileLinesIterDataset
from chute._src.iter.file_stream import JsonlIterDataset as JsonlIterDataset
from chute._src.iter.flat_map import FlatMapIterDataset as FlatMapIterDataset
from chute._src.iter.interleave import InterleaveIterDataset as InterleaveIterDataset
from chute._src.iter.limit import LimitIterDataset as LimitIterDataset
from chute._src.iter.pack_best_fit import BestFitPackIterDataset as BestFitPackIterDataset
from chute._src.iter.pack_first_fit import FirstFitPackIterDataset as FirstFitPackIterDataset
from chute._src.iter.rebatch import RebatchIterDataset as RebatchIterDataset
from chute._src.iter.repeat import RepeatIterDataset as RepeatIterDataset
from chute._src.iter.thread_prefetch import (
    ThreadPrefetchIterDataset as ThreadPrefetchIterDataset,
)
from chute._src.iter.window_shuffle import (
    WindowShuffleIterDataset as WindowShuffleIterDataset,
)
from chute._src.iter.zip import ZipIterDataset as ZipIterDataset
from chute._src.map.flat_map import FlatMapMapDataset as FlatMapMapDataset
from chute._src.map.flat_map import FlatMapTransform as FlatMapTransform
from chute._src.map.window_shuffle import WindowShuffleMapDataset as WindowShuffleMapDataset
from chute._src.map.zip import ZipMapDataset as ZipMapDataset

__all__ = [
    "BOSHandling",
    "BestFitPackIterDataset",
    "CacheIterDataset",
    "ConcatThenSplitIterDataset",
    "DiskCacheIterDataset",
    "ElasticIterator",
    "FileLinesIterDataset",
    "FirstFitPackIterDataset",
    "FlatMapIterDataset",
    "FlatMapMapDataset",
    "FlatMapTransform",
    "InterleaveIterDataset",
    "JsonlIterDataset",
    "LimitIterDataset",
    "RebatchIterDataset",
    "RepeatIterDataset",
    "ThreadPrefetchIterDataset",
    "WindowShuffleIterDataset",
    "WindowShuffleMapDataset",
    "ZipIterDataset",
    "ZipMapDataset",
]
