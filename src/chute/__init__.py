"""chute: a deterministic, exactly resumable, fast data loader for JAX and PyTorch.

The names follow Grain's, so `import chute as grain` runs code written for Grain.

Every public name is imported on first use: `import chute` loads almost nothing, and a
worker process loads only the modules its pipeline is made of. The debug layer (`stats`,
`PipelineStats`, `StageStats`) is thus loaded only when used, or when a debug option is
switched on in `chute.config`: a pipeline run without it never loads it. `chute.torch`
(the `[torch]` extra) and `chute.ray` (the `[ray]` extra) are reached the same way:
`import chute` imports neither torch nor Ray.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from chute import checkpoint as checkpoint
    from chute import config as config
    from chute import constants as constants
    from chute import experimental as experimental
    from chute import multiprocessing as multiprocessing
    from chute import ray as ray
    from chute import records as records
    from chute import samplers as samplers
    from chute import sharding as sharding
    from chute import sources as sources
    from chute import testing as testing
    from chute import torch as torch
    from chute import transforms as transforms
    from chute._src.core.dataset import IterDataset as IterDataset
    from chute._src.core.dataset import MapDataset as MapDataset
    from chute._src.core.errors import CheckpointError as CheckpointError
    from chute._src.core.errors import ChuteError as ChuteError
    from chute._src.core.errors import DataError as DataError
    from chute._src.core.iterator import DatasetIterator as DatasetIterator
    from chute._src.core.options import MultiprocessingOptions as MultiprocessingOptions
    from chute._src.core.options import ReadOptions as ReadOptions
    from chute._src.core.progress import Progress as Progress
    from chute._src.core.progress import progress as progress
    from chute._src.core.transforms import Batch as Batch
    from chute._src.core.transforms import FilterTransform as FilterTransform
    from chute._src.core.transforms import MapTransform as MapTransform
    from chute._src.core.transforms import MapWithIndex as MapWithIndex
    from chute._src.core.transforms import RandomMapTransform as RandomMapTransform
    from chute._src.core.transforms import TypeConversion as TypeConversion
    from chute._src.core.tuning import AUTOTUNE as AUTOTUNE
    from chute._src.debug.stats import PipelineStats as PipelineStats
    from chute._src.debug.stats import StageStats as StageStats
    from chute._src.debug.stats import stats as stats
    from chute._src.frameworks.dataloader import DataLoader as DataLoader
    from chute._src.frameworks.dataloader import DataLoaderIterator as DataLoaderIterator
    from chute._src.frameworks.load import load as load
    from chute._src.frameworks.record import Record as Record
    from chute._src.frameworks.samplers import IndexSampler as IndexSampler
    from chute._src.frameworks.samplers import RecordMetadata as RecordMetadata
    from chute._src.frameworks.samplers import SequentialSampler as SequentialSampler

__version__ = "0.1.0"

# How the engine loads the debug layer when a debug option is switched on: the engine
# (`_src/core/config.py`) never imports it itself.
from chute._src.core import config as _config


def _load_debug_layer() -> None:
    import chute._src.debug.stats  # noqa: F401  (installs the debug observer)


_config.register_debug_layer(_load_debug_layer)

# The public names: each one and the module it is defined in ("chute": a public submodule,
# `chute.<name>`). The one table: `__all__`, `__getattr__` and `__dir__` read it; the
# imports under TYPE_CHECKING above say the same to type checkers, and
# tests/project/test_api.py checks that they match it.
_PUBLIC = {
    "checkpoint": "chute",
    "config": "chute",
    "constants": "chute",
    "experimental": "chute",
    "multiprocessing": "chute",
    "ray": "chute",
    "records": "chute",
    "samplers": "chute",
    "sharding": "chute",
    "sources": "chute",
    "testing": "chute",
    "torch": "chute",
    "transforms": "chute",
    "IterDataset": "chute._src.core.dataset",
    "MapDataset": "chute._src.core.dataset",
    "CheckpointError": "chute._src.core.errors",
    "ChuteError": "chute._src.core.errors",
    "DataError": "chute._src.core.errors",
    "DatasetIterator": "chute._src.core.iterator",
    "MultiprocessingOptions": "chute._src.core.options",
    "ReadOptions": "chute._src.core.options",
    "Progress": "chute._src.core.progress",
    "progress": "chute._src.core.progress",
    "Batch": "chute._src.core.transforms",
    "FilterTransform": "chute._src.core.transforms",
    "MapTransform": "chute._src.core.transforms",
    "MapWithIndex": "chute._src.core.transforms",
    "RandomMapTransform": "chute._src.core.transforms",
    "TypeConversion": "chute._src.core.transforms",
    "AUTOTUNE": "chute._src.core.tuning",
    "PipelineStats": "chute._src.debug.stats",
    "StageStats": "chute._src.debug.stats",
    "stats": "chute._src.debug.stats",
    "DataLoader": "chute._src.frameworks.dataloader",
    "DataLoaderIterator": "chute._src.frameworks.dataloader",
    "load": "chute._src.frameworks.load",
    "Record": "chute._src.frameworks.record",
    "IndexSampler": "chute._src.frameworks.samplers",
    "RecordMetadata": "chute._src.frameworks.samplers",
    "SequentialSampler": "chute._src.frameworks.samplers",
}

# Defined for the interpreter only: type checkers see the imports above, so a
# misspelt name is an error there too, and `from chute import *` gives them those names.
if not _typing.TYPE_CHECKING:
    __all__ = sorted(_PUBLIC)

    def __getattr__(name: str) -> _typing.Any:
        module = _PUBLIC.get(name)
        if module is None:
            raise AttributeError(f"module 'chute' has no attribute {name!r}")
        if module == "chute":
            value = _importlib.import_module(f"chute.{name}")
        else:
            value = getattr(_importlib.import_module(module), name)
        globals()[name] = value  # later lookups do not come here
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
