"""Grain's older `grain.python` namespace: the same objects under the names it used.

`PyGrainDatasetIterator` is the DataLoader's iterator, `PyGrainCheckpointHandler` the
Orbax handler, with its arguments `PyGrainCheckpointSave`/`PyGrainCheckpointRestore` (also
named `GrainCheckpointSave`/`GrainCheckpointRestore`, as Grain's DataLoader tutorial calls
them, though grain 0.2.18 lacks those names), `InMemoryDataSource` the
`SharedMemoryDataSource`; the operations (`MapOperation`, `BatchOperation`, ...) are
accepted by `DataLoader(operations=...)`.
"""

import typing

from chute import config as config
from chute import experimental as experimental
from chute._src.core.data_source import RandomAccessDataSource as RandomAccessDataSource
from chute._src.core.dataset import IterDataset as IterDataset
from chute._src.core.dataset import MapDataset as MapDataset
from chute._src.core.iterator import DatasetIterator as DatasetIterator
from chute._src.core.options import MultiprocessingOptions as MultiprocessingOptions
from chute._src.core.options import ReadOptions as ReadOptions
from chute._src.core.transforms import Batch as Batch
from chute._src.core.transforms import FilterTransform as FilterTransform
from chute._src.core.transforms import MapTransform as MapTransform
from chute._src.core.transforms import MapWithIndex as MapWithIndexTransform
from chute._src.core.transforms import RandomMapTransform as RandomMapTransform
from chute._src.exec.mp.shared_memory import SharedMemoryArray as SharedMemoryArray
from chute._src.exec.mp.shared_memory import SharedMemoryDataSource as InMemoryDataSource
from chute._src.frameworks.dataloader import DataLoader as DataLoader
from chute._src.frameworks.dataloader import DataLoaderIterator as PyGrainDatasetIterator
from chute._src.frameworks.load import load as load
from chute._src.frameworks.operations import BatchOperation as BatchOperation
from chute._src.frameworks.operations import FilterOperation as FilterOperation
from chute._src.frameworks.operations import MapOperation as MapOperation
from chute._src.frameworks.operations import Operation as Operation
from chute._src.frameworks.operations import RandomMapOperation as RandomMapOperation
from chute._src.frameworks.record import Record as Record
from chute._src.frameworks.sampler_protocol import Sampler as Sampler
from chute._src.frameworks.samplers import IndexSampler as IndexSampler
from chute._src.frameworks.samplers import RecordMetadata as RecordMetadata
from chute._src.frameworks.samplers import SequentialSampler as SequentialSampler
from chute._src.frameworks.sharding import NoSharding as NoSharding
from chute._src.frameworks.sharding import ShardByJaxProcess as ShardByJaxProcess
from chute._src.frameworks.sharding import ShardOptions as ShardOptions
from chute._src.ops.selection_map import DatasetSelectionMap as DatasetSelectionMap
from chute._src.storage.formats.array_record import ArrayRecordDataSource as ArrayRecordDataSource
from chute._src.storage.formats.range import RangeDataSource as RangeDataSource
from chute.constants import DATASET_INDEX as DATASET_INDEX
from chute.constants import EPOCH as EPOCH
from chute.constants import INDEX as INDEX
from chute.constants import META_FEATURES as META_FEATURES
from chute.constants import RECORD as RECORD
from chute.constants import RECORD_KEY as RECORD_KEY
from chute.constants import SEED as SEED
from chute.transforms import Transformation as Transformation
from chute.transforms import Transformations as Transformations

if typing.TYPE_CHECKING:
    from chute._src.frameworks.orbax_args import CheckpointHandler as PyGrainCheckpointHandler
    from chute._src.frameworks.orbax_args import CheckpointRestore as GrainCheckpointRestore
    from chute._src.frameworks.orbax_args import CheckpointRestore as PyGrainCheckpointRestore
    from chute._src.frameworks.orbax_args import CheckpointSave as GrainCheckpointSave
    from chute._src.frameworks.orbax_args import CheckpointSave as PyGrainCheckpointSave

_ORBAX_ARGS = {
    "PyGrainCheckpointHandler": "CheckpointHandler",
    "PyGrainCheckpointSave": "CheckpointSave",
    "GrainCheckpointSave": "CheckpointSave",
    "GrainCheckpointRestore": "CheckpointRestore",
    "PyGrainCheckpointRestore": "CheckpointRestore",
}

__all__ = [
    "ArrayRecordDataSource",
    "Batch",
    "BatchOperation",
    "DATASET_INDEX",
    "DataLoader",
    "DatasetIterator",
    "DatasetSelectionMap",
    "EPOCH",
    "FilterOperation",
    "FilterTransform",
    "GrainCheckpointRestore",
    "GrainCheckpointSave",
    "INDEX",
    "InMemoryDataSource",
    "IndexSampler",
    "IterDataset",
    "META_FEATURES",
    "MapDataset",
    "MapOperation",
    "MapTransform",
    "MapWithIndexTransform",
    "MultiprocessingOptions",
    "NoSharding",
    "Operation",
    "PyGrainCheckpointHandler",
    "PyGrainCheckpointRestore",
    "PyGrainCheckpointSave",
    "PyGrainDatasetIterator",
    "RECORD",
    "RECORD_KEY",
    "RandomAccessDataSource",
    "RandomMapOperation",
    "RandomMapTransform",
    "RangeDataSource",
    "ReadOptions",
    "Record",
    "RecordMetadata",
    "SEED",
    "Sampler",
    "SequentialSampler",
    "ShardByJaxProcess",
    "ShardOptions",
    "SharedMemoryArray",
    "Transformation",
    "Transformations",
    "config",
    "experimental",
    "load",
]


def __getattr__(name: str) -> typing.Any:
    if name in _ORBAX_ARGS:  # imports Orbax, so only when asked for
        from chute._src.frameworks.orbax_handler import orbax_class

        return orbax_class(_ORBAX_ARGS[name])
    raise AttributeError(f"module 'chute.python' has no attribute {name!r}")
