"""Stages whose API may still change: prefetching, packing, mixing, interleaving, caching,
the `ElasticIterator` (global batches resumable with another host count), and after a
loss spike, `provenance` (the source records behind steps, from an iterator or a saved
state), `skip`/`skip_state` (move past steps without reading them where positions are
index arithmetic) and `Origin`, what a stage's `_origins` returns (docs/loss_spike.md,
docs/extending.md)."""

from chute._src.core.element_spec import ShapeDtypeStruct as ShapeDtypeStruct
from chute._src.core.element_spec import ShapeDtypeStructProtocol as ShapeDtypeStructProtocol
from chute._src.core.element_spec import get_element_spec as get_element_spec
from chute._src.core.next_index import get_next_index as get_next_index
from chute._src.core.next_index import set_next_index as set_next_index
from chute._src.core.options import DatasetOptions as DatasetOptions
from chute._src.core.options import ExecutionTrackingMode as ExecutionTrackingMode
from chute._src.core.provenance import Origin as Origin
from chute._src.core.provenance import ProvenanceError as ProvenanceError
from chute._src.core.provenance_api import provenance as provenance
from chute._src.core.skip import skip as skip
from chute._src.core.skip import skip_state as skip_state
from chute._src.core.transforms import MapWithIndex as MapWithIndexTransform
from chute._src.exec.thread_prefetch import (
    ThreadPrefetchDatasetIterator as ThreadPrefetchDatasetIterator,
)
from chute._src.exec.thread_prefetch import (
    ThreadPrefetchIterDataset as ThreadPrefetchIterDataset,
)
from chute._src.exec.thread_prefetch import multithread_prefetch as multithread_prefetch
from chute._src.frameworks.device_put import device_put as device_put
from chute._src.frameworks.device_put import make_global_arrays as make_global_arrays
from chute._src.frameworks.elastic import ElasticIterator as ElasticIterator
from chute._src.frameworks.operations import PackAndBatchOperation as PackAndBatchOperation
from chute._src.ops.apply import apply_transformations as apply_transformations
from chute._src.ops.batch_by_tokens import BatchByTokensIterDataset as BatchByTokensIterDataset
from chute._src.ops.bucket_by_length import (
    BucketBySequenceLengthIterDataset as BucketBySequenceLengthIterDataset,
)
from chute._src.ops.cache import CacheIterDataset as CacheIterDataset
from chute._src.ops.cache import CacheMapDataset as CacheMapDataset
from chute._src.ops.disk_cache import DiskCacheIterDataset as DiskCacheIterDataset
from chute._src.ops.even_batches import EvenBatchesIterDataset as EvenBatchesIterDataset
from chute._src.ops.even_batches import count_batches as count_batches
from chute._src.ops.even_batches import zeros_like_batch as zeros_like_batch
from chute._src.ops.file_sources import ParquetIterDataset as ParquetIterDataset
from chute._src.ops.file_sources import TFRecordIterDataset as TFRecordIterDataset
from chute._src.ops.file_stream import FileLinesIterDataset as FileLinesIterDataset
from chute._src.ops.file_stream import JsonlIterDataset as JsonlIterDataset
from chute._src.ops.filter_check import WithOptionsIterDataset as WithOptionsIterDataset
from chute._src.ops.flat_map import FlatMapIterDataset as FlatMapIterDataset
from chute._src.ops.flat_map import FlatMapMapDataset as FlatMapMapDataset
from chute._src.ops.flat_map import FlatMapTransform as FlatMapTransform
from chute._src.ops.index_shuffle import index_shuffle as index_shuffle
from chute._src.ops.interleave import InterleaveIterDataset as InterleaveIterDataset
from chute._src.ops.limit import LimitIterDataset as LimitIterDataset
from chute._src.ops.mix import set_mix_weights as set_mix_weights
from chute._src.ops.packing.best_fit import BestFitPackIterDataset as BestFitPackIterDataset
from chute._src.ops.packing.concat_split import BOSHandling as BOSHandling
from chute._src.ops.packing.concat_split import (
    ConcatThenSplitIterDataset as ConcatThenSplitIterDataset,
)
from chute._src.ops.packing.first_fit import FirstFitPackIterDataset as FirstFitPackIterDataset
from chute._src.ops.pad_batch import batch_and_pad as batch_and_pad
from chute._src.ops.rebatch import RebatchIterDataset as RebatchIterDataset
from chute._src.ops.repeat import RepeatIterDataset as RepeatIterDataset
from chute._src.ops.window_shuffle import (
    WindowShuffleIterDataset as WindowShuffleIterDataset,
)
from chute._src.ops.window_shuffle import WindowShuffleMapDataset as WindowShuffleMapDataset
from chute._src.ops.zip import ZipIterDataset as ZipIterDataset
from chute._src.ops.zip import ZipMapDataset as ZipMapDataset
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
    "Origin",
    "PackAndBatchOperation",
    "ParquetIterDataset",
    "ProvenanceError",
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
    "provenance",
    "set_mix_weights",
    "set_next_index",
    "skip",
    "skip_state",
    "zeros_like_batch",
]
