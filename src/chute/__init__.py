"""chute: a deterministic, exactly resumable, fast data loader for JAX and PyTorch.

The names follow Grain's, so `import chute as grain` runs code written for Grain.

The debug layer (`stats`, `PipelineStats`, `StageStats`) is imported on first use, or when a
debug option is switched on in `chute.config`: a pipeline run without it never loads it.
"""

import typing as _typing

from chute import checkpoint as checkpoint
from chute import config as config
from chute import constants as constants
from chute import experimental as experimental
from chute import multiprocessing as multiprocessing
from chute import records as records
from chute import samplers as samplers
from chute import sharding as sharding
from chute import sources as sources
from chute import testing as testing
from chute import transforms as transforms
from chute._src.autotune import AUTOTUNE as AUTOTUNE
from chute._src.dataloader import DataLoader as DataLoader
from chute._src.dataloader import DataLoaderIterator as DataLoaderIterator
from chute._src.dataset import IterDataset as IterDataset
from chute._src.dataset import MapDataset as MapDataset
from chute._src.errors import CheckpointError as CheckpointError
from chute._src.errors import ChuteError as ChuteError
from chute._src.errors import DataError as DataError
from chute._src.iterator import DatasetIterator as DatasetIterator
from chute._src.load import load as load
from chute._src.options import MultiprocessingOptions as MultiprocessingOptions
from chute._src.options import ReadOptions as ReadOptions
from chute._src.progress import Progress as Progress
from chute._src.progress import progress as progress
from chute._src.record import Record as Record
from chute._src.samplers import IndexSampler as IndexSampler
from chute._src.samplers import RecordMetadata as RecordMetadata
from chute._src.samplers import SequentialSampler as SequentialSampler
from chute._src.transforms import Batch as Batch
from chute._src.transforms import FilterTransform as FilterTransform
from chute._src.transforms import MapTransform as MapTransform
from chute._src.transforms import MapWithIndex as MapWithIndex
from chute._src.transforms import RandomMapTransform as RandomMapTransform
from chute._src.transforms import TypeConversion as TypeConversion

if _typing.TYPE_CHECKING:
    from chute._src.stats import PipelineStats as PipelineStats
    from chute._src.stats import StageStats as StageStats
    from chute._src.stats import stats as stats

__version__ = "0.1.0"

_DEBUG_LAYER = ("PipelineStats", "StageStats", "stats")


def __getattr__(name: str) -> _typing.Any:
    if name in _DEBUG_LAYER:
        from chute._src import stats as _stats

        value = globals()[name] = getattr(_stats, name)
        return value
    raise AttributeError(f"module 'chute' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_DEBUG_LAYER})


__all__ = [
    "AUTOTUNE",
    "Batch",
    "CheckpointError",
    "ChuteError",
    "DataError",
    "DataLoader",
    "DataLoaderIterator",
    "DatasetIterator",
    "FilterTransform",
    "IndexSampler",
    "IterDataset",
    "MapDataset",
    "MapTransform",
    "MapWithIndex",
    "MultiprocessingOptions",
    "PipelineStats",
    "Progress",
    "RandomMapTransform",
    "ReadOptions",
    "Record",
    "RecordMetadata",
    "SequentialSampler",
    "StageStats",
    "TypeConversion",
    "checkpoint",
    "config",
    "constants",
    "experimental",
    "load",
    "multiprocessing",
    "progress",
    "records",
    "samplers",
    "sharding",
    "sources",
    "stats",
    "testing",
    "transforms",
]
