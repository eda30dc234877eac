"""The one place core reaches up: what the chain methods construct.

`MapDataset.map`, `IterDataset.batch` and the other chain methods each construct a named
class of `ops/` (or, for `to_iter_dataset`, `prefetch` and `mp_prefetch`, of `exec/`);
`MultiprocessingOptions.start_service` starts exec's worker processes. Those floors sit
above core and import it, so core names them here, by module, and imports one when it is
first asked for. This table is the layering's one exception
(`tests/project/test_layout.py`), as the chain methods of Grain's `dataset.py` import
their transformations when called.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

OPERATIONS: dict[str, str] = {
    "prefetch": "exec.thread_prefetch",
    "PrefetchIterDataset": "exec.reader",
    "MultiprocessPrefetchIterDataset": "exec.workers.stage",
    "start_processes": "exec.workers.service",
    "apply_transformations": "ops.apply",
    "BatchIterDataset": "ops.batch",
    "BatchMapDataset": "ops.batch",
    "BatchByTokensIterDataset": "ops.batch_by_tokens",
    "BucketBySequenceLengthIterDataset": "ops.bucket_by_length",
    "CacheIterDataset": "ops.cache",
    "CacheMapDataset": "ops.cache",
    "ConcatenateMapDataset": "ops.concatenate",
    "DiskCacheIterDataset": "ops.disk_cache",
    "EvenBatchesIterDataset": "ops.even_batches",
    "FilterIterDataset": "ops.filter",
    "FilterMapDataset": "ops.filter",
    "IterableSourceIterDataset": "ops.iterable_source",
    "LimitIterDataset": "ops.limit",
    "MapIterDataset": "ops.map",
    "MapMapDataset": "ops.map",
    "MapWithIndexIterDataset": "ops.map",
    "MapWithIndexMapDataset": "ops.map",
    "MixedIterDataset": "ops.mix",
    "MixedMapDataset": "ops.mix",
    "SelectFromDatasetsMapDataset": "ops.mix",
    "batch_fn_with_padding": "ops.pad_batch",
    "RandomMapIterDataset": "ops.random_map",
    "RandomMapMapDataset": "ops.random_map",
    "RepeatIterDataset": "ops.repeat",
    "RepeatMapDataset": "ops.repeat",
    "SeedIterDataset": "ops.seed",
    "SeedMapDataset": "ops.seed",
    "ShuffleMapDataset": "ops.shuffle",
    "SliceMapDataset": "ops.slice",
    "RangeMapDataset": "ops.source",
    "SourceMapDataset": "ops.source",
}
"""What each chain method constructs (a class or a function) -> its module under `_src`."""


@functools.cache
def operation(name: str) -> Any:
    """`OPERATIONS`' entry `name`, imported on first use."""
    return getattr(importlib.import_module(f"chute._src.{OPERATIONS[name]}"), name)
