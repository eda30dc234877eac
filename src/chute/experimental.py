"""Stages whose API may still change: prefetching, packing, mixing, interleaving, caching,
and the `ElasticIterator` (global batches resumable with another host count)."""

from chute._src.apply import apply_transformations as apply_transformations
from chute._src.batch_and_pad import batch_and_pad as batch_and_pad
from chute._src.dataset_options import DatasetOptions as DatasetOptions
from chute._src.dataset_options import ExecutionTrackingMode as ExecutionTrackingMode
from chute._src.dataset_options import WithOptionsIterDataset as WithOptionsIterDataset
from chute._src.device_put import device_put as device_put
from chute._src.device_put import make_global_arrays as make_global_arrays
from chute._src.elastic import ElasticIterator as ElasticIterator
from chute._src.element_spec import ShapeDtypeStruct as ShapeDtypeStruct
from chute._src.element_spec import ShapeDtypeStructProtocol as ShapeDtypeStructProtocol
from chute._src.element_spec import get_element_spec as get_element_spec
from chute._src.index_shuffle_fn import index_shuffle as index_shuffle
from chute._src.iter.batch_by_tokens import BatchByTokensIterDataset as BatchByTokensIterDataset
from chute._src.iter.bucket_by_length import (
    BucketBySequenceLengthIterDataset as BucketBySequenceLengthIterDataset,
)
from chute._src.iter.cache import CacheIterDataset as CacheIterDataset
from chute._src.iter.concat_split import BOSHandling as BOSHandling
from chute._src.iter.concat_split import (
    ConcatThenSplitIterDataset as ConcatThenSplitIterDataset,
)
from chute._src.iter.disk_cache import DiskCacheIterDataset as DiskCacheIterDataset
from chute._src.iter.even_batches import EvenBatchesIterDataset as EvenBatchesIterDataset
from chute._src.iter.even_batches import count_batches as count_batches
from chute._src.iter.even_batches import zeros_like_batch as zeros_like_batch
from chute._src.iter.file_sources import ParquetIterDataset as ParquetIterDataset
from chute._src.iter.file_sources import TFRecordIterDataset as TFRecordIterDataset
from chute._src.iter.file_stream import FileLinesIterDataset as FileLinesIterDataset
from chute._src.iter.file_stream import JsonlIterDataset as JsonlIterDataset
from chute._src.iter.flat_map import FlatMapIterDataset as FlatMapIterDataset
from chute._src.iter.interleave import InterleaveIterDataset as InterleaveIterDataset
from chute._src.iter.limit import LimitIterDataset as LimitIterDataset
from chute._src.iter.mix import set_mix_weights as set_mix_weights
from chute._src.iter.multithread_prefetch import (
    ThreadPrefetchDatasetIterator as ThreadPrefetchDatasetIterator,
)
from chute._src.iter.multithread_prefetch import multithread_prefetch as multithread_prefetch
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
from chute._src.map.cache import CacheMapDataset as CacheMapDataset
from chute._src.map.flat_map import FlatMapMapDataset as FlatMapMapDataset
from chute._src.map.flat_map import FlatMapTransform as FlatMapTransform
from chute._src.map.window_shuffle import WindowShuffleMapDataset as WindowShuffleMapDataset
from chute._src.map.zip import ZipMapDataset as ZipMapDataset
from chute._src.next_index import get_next_index as get_next_index
from chute._src.next_index import set_next_index as set_next_index
from chute._src.transforms import MapWithIndex as MapWithIndexTransform
from chute.testing import (
    assert_equal_output_after_checkpoint as assert_equal_output_after_checkpoint,
)

__all__ = [
    "BOSHandling",
    "BatchByTokensIterDataset",
    "BestFitPackIterDataset",
    "BucketBySequenceLengthIterDataset",
    "CacheIterDataset",
    "CacheMapDataset",
    "ConcatThenSplitIterDataset",
    "DatasetOptions",
    "DiskCacheIterDataset",
    "ElasticIterator",
    "EvenBatchesIterDataset",
    "ExecutionTrackingMode",
    "FileLinesIterDataset",
    "FirstFitPackIterDataset",
    "FlatMapIterDataset",
    "FlatMapMapDataset",
    "FlatMapTransform",
    "InterleaveIterDataset",
    "JsonlIterDataset",
    "LimitIterDataset",
    "MapWithIndexTransform",
    "ParquetIterDataset",
    "RebatchIterDataset",
    "RepeatIterDataset",
    "ShapeDtypeStruct",
    "ShapeDtypeStructProtocol",
    "TFRecordIterDataset",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "WindowShuffleIterDataset",
    "WindowShuffleMapDataset",
    "WithOptionsIterDataset",
    "ZipIterDataset",
    "ZipMapDataset",
    "apply_transformations",
    "assert_equal_output_after_checkpoint",
    "batch_and_pad",
    "count_batches",
    "device_put",
    "get_element_spec",
    "get_next_index",
    "index_shuffle",
    "make_global_arrays",
    "multithread_prefetch",
    "set_mix_weights",
    "set_next_index",
    "zeros_like_batch",
]
