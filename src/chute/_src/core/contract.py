"""What a stage is to the engine: `StageRole`, declared by every dataset node.

The code that walks a pipeline (worker processes, debug timing, interleave) never asks for a
stage's class; it reads `node.role` and calls the methods that role promises:

- `SOURCE`: reads data; has no parents.
- `READER`: `to_iter_dataset`, reading its one MapDataset parent in index order. It has
  `with_executor(executor_factory, computed)`: the same stage, its chunks computed by another
  `ChunkExecutor` (`_src/exec/executors.py`), from `computed` (the parent plus stages moved
  into it), with the parent's state and fingerprint; and `allow_nones`: whether it hands
  filtered elements on as None (then the stages above it must see them).
- `ELEMENT_WISE`: each output depends on one input alone, whatever its position (`map`,
  `filter`): `as_map_stage(parent)` gives the equivalent MapDataset stage on `parent`, so
  `mp_prefetch` can move it into the workers.
- `PREFETCH`: hands on its input unchanged, computed ahead elsewhere (threads, processes).
- `PASS_THROUGH`: hands on its input unchanged and does no work of its own (a seed, a
  stage with prefetching turned off, a stand-in for a stage moved into the workers). The
  debug summary never names these as the bottleneck. A node's separate `internal` flag
  marks a stage the engine inserted (the stand-in): the summary hides it.
- `ORDER_DEPENDENT`: everything else (batch, packing, mixing, shuffles of a stream, user
  stages): what it produces depends on the order of its input. The default.

Besides its role, a node says `reads_shards`: True for a stage (an interleave) whose
parents are the shards of one stream, each read whole and on its own, and merged by the
stage's own rule. `mp_prefetch` replaces each such parent (`with_parents`) by one fed by a
worker process that reads the shard and the element-wise stages above the merge.

A `SOURCE` node that reads a user's source object shows it as `data_source`; what such an
object may declare to the engine (`reads_in_flight`) is in `_src/exec/in_flight.py`.
"""

from __future__ import annotations

import enum


class StageRole(enum.Enum):
    SOURCE = "source"
    READER = "reader"
    ELEMENT_WISE = "element_wise"
    PREFETCH = "prefetch"
    PASS_THROUGH = "pass_through"
    ORDER_DEPENDENT = "order_dependent"


__all__ = ["StageRole"]
