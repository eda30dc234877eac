"""The messages between the main process and the workers: what a worker is asked to do,
and what it sends back. Frozen dataclasses, pickled with each task; a worker tells the
kinds apart with `match`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chute._src.core.columns import Columns
from chute._src.exec.mp.transport import RemoteFailure


@dataclass(frozen=True, slots=True)
class ChunkTask:
    """Compute elements `[start, start + k)` of the pipeline's random-access part number
    `leaf` (one per `to_iter_dataset` reader the workers feed)."""

    leaf: int
    start: int
    k: int

    def describe(self, several_leaves: bool) -> str:
        where = (
            f"element index {self.start}"
            if self.k == 1
            else f"element indices {self.start} to {self.start + self.k - 1}"
        )
        return where + (f" of to_iter_dataset input {self.leaf}" if several_leaves else "")


@dataclass(frozen=True, slots=True)
class ShardTask:
    """Read `steps` steps of `n` elements of shard `shard` of stream `stream` (a stage that
    reads shards, `shards.py`), starting from `start`: None goes on from where the
    worker's open copy of the shard is, `"initial"` opens the shard at its beginning, any
    other value is a state of the shard to restore first."""

    stream: int
    shard: int
    start: Any
    n: int
    steps: int

    def describe(self, several_leaves: bool) -> str:
        return f"reading shard {self.shard} of a stream"


Task = ChunkTask | ShardTask


@dataclass(frozen=True, slots=True)
class ChunkResult:
    """A `ChunkTask` done: its elements (as `Columns` when they stack leaf by leaf), or
    those before the one that raised and that one's exception; the seconds it took; the
    debug layer's figures (debug mode only)."""

    seconds: float
    items: list[Any] | Columns
    figures: list[Any]
    failure: RemoteFailure | None


@dataclass(frozen=True, slots=True)
class ShardResult:
    """A `ShardTask` done: each step's elements with the shard's state after it (None
    after the last); whether the shard ended; the exception that stopped it, if one did;
    the debug layer's figures (debug mode only)."""

    seconds: float
    steps: list[tuple[list[Any], Any]]
    ended: bool
    failure: RemoteFailure | None
    figures: list[Any] = field(default_factory=list)


Result = ChunkResult | ShardResult
