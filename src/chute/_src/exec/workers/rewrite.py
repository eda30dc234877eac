"""The rewrite that moves a pipeline into the workers.

`substitute` copies the pipeline above an `mp_prefetch` stage: each reader
(`to_iter_dataset`, a READER) gets its chunks from the workers (`feeding.WorkerChunks`),
each stage that reads shards (`reads_shards`) has its shards read in workers
(`shards.WorkerShard`), and the element-wise stages directly above either are moved into
the workers, leaving a `DoneInWorkers` in their place so that states keep their shape.
Everything else (the order-dependent stages) stays in the main process, on the same
elements in the same order as without workers.
"""

from __future__ import annotations

from typing import Any, cast

from chute._src.core import contract, observe
from chute._src.core.columns import Columns
from chute._src.core.contract import ElementWise, StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.core.node import rewrite
from chute._src.exec.executors import ChunkExecutor
from chute._src.exec.workers.feeding import WorkerChunks
from chute._src.exec.workers.service import ServiceBox
from chute._src.exec.workers.shards import DropHoles, ShardStream, WorkerShard, has_reader


def substitute(
    ds: IterDataset[Any],
    leaves: list[MapDataset[Any]],
    streams: list[ShardStream],
    box: ServiceBox,
) -> IterDataset[Any]:
    """A copy of `ds` whose readers (`to_iter_dataset`) get their chunks from workers, and
    whose streams of shards have their shards read by workers, with the element-wise
    stages directly above them moved into the workers (see module doc)."""

    def moved(node: Any) -> bool:  # what `rewrite` hands over whole, with all below it
        return not isinstance(node, IterDataset) or _fed_by_workers(node)

    def to_workers(node: Any) -> Any:
        if not isinstance(node, IterDataset) or not _fed_by_workers(node):
            return node
        hoisted, base = _element_wise_chain(node)
        if contract.role(base) is StageRole.READER:
            return _worker_fed_reader(base, hoisted, leaves, box)
        return _worker_read_shards(base, hoisted, streams, box)

    return rewrite(ds, to_workers, stop=moved)


def _element_wise_chain(node: IterDataset[Any]) -> tuple[list[ElementWise], IterDataset[Any]]:
    """The ELEMENT_WISE stages from `node` down (top first), and the stage below them."""
    hoisted: list[ElementWise] = []
    while contract.role(node) is StageRole.ELEMENT_WISE:
        hoisted.append(contract.element_wise(node))
        node = node.parents[0]  # type: ignore[assignment]
    return hoisted, node


def _fed_by_workers(node: IterDataset[Any]) -> bool:
    """Whether `node` is a reader or a stream of shards with no reader in them (each shard
    then read whole in a worker), or the element-wise stages directly above one."""
    _, base = _element_wise_chain(node)
    if contract.role(base) is StageRole.READER:
        return True
    return contract.reads_shards(base) and not any(
        has_reader(p)  # type: ignore[arg-type]
        for p in base.parents
    )


def _worker_read_shards(
    node: IterDataset[Any], hoisted: list[ElementWise], streams: list[ShardStream], box: ServiceBox
) -> IterDataset[Any]:
    """A stream of shards (`shards.py`): each shard read whole in a worker."""
    shards: list[IterDataset[Any]] = list(node.parents)  # type: ignore[arg-type]
    stream = ShardStream(shards, hoisted)
    streams.append(stream)
    s = len(streams) - 1
    merged = contract.with_parents(node, [WorkerShard(p, s, j, box) for j, p in enumerate(shards)])
    if hoisted:
        merged = DropHoles(merged)
    for stage, moved in zip(reversed(hoisted), stream.moved):
        merged = DoneInWorkers(merged, stage._stage_name, contract.position_params(stage), moved)
    return merged


def _worker_fed_reader(
    node: IterDataset[Any],
    hoisted: list[ElementWise],
    leaves: list[MapDataset[Any]],
    box: ServiceBox,
) -> IterDataset[Any]:
    """A reader whose chunks workers compute, the element-wise stages above it applied in
    the workers to its MapDataset (the leaf)."""
    reader = contract.reader(node)
    kept: list[ElementWise] = []
    if reader._hands_out_nones:
        # The stages above see the Nones: they stay in the main process, as they are.
        hoisted, kept = [], hoisted
    mapped: MapDataset[Any] = node.parents[0]  # type: ignore[assignment]
    moved: list[MapDataset[Any]] = []  # each hoisted stage as the workers run it
    for stage in reversed(hoisted):
        mapped = stage._as_map_stage(mapped)
        moved.append(mapped)
    observer = observe.observing()
    if observer is not None:
        mapped = observer.map_chain(mapped)
    leaves.append(mapped)
    leaf_id = len(leaves) - 1

    def executor(leaf: MapDataset[Any] = mapped, leaf_id: int = leaf_id) -> ChunkExecutor:
        assert box.service is not None, "a worker-fed reader iterated before the service"
        return WorkerChunks(leaf, leaf_id, box.service)

    out: IterDataset[Any] = reader._with_executor(executor)
    for stage, done in zip(reversed(hoisted), moved):
        out = DoneInWorkers(out, stage._stage_name, contract.position_params(stage), done)
    for stage in reversed(kept):
        out = cast("IterDataset[Any]", contract.with_parents(stage, [out]))
    return out


class DoneInWorkers(IterDataset[Any]):
    """Stands where a `map`/`filter` was that now runs in the workers: a pass-through with
    the same stage name, so the state has the same shape as without workers.

    `_stands_for` is the stage as the workers run it (its MapDataset form): the debug
    layer's figures show that stage's work in this one's place (`_src/debug/stats.py`)."""

    _role = StageRole.PASS_THROUGH
    _internal = True

    def __init__(
        self, parent: IterDataset[Any], stage: str, params: str, moved: MapDataset[Any]
    ) -> None:
        super().__init__([parent])
        self._stage = stage
        self._params = params
        self._stands_for = moved

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _PassThrough(self._parent_iter(), self._stage)

    def __repr__(self) -> str:
        return f"{self._stage} (done in the workers)"

    def _fingerprint_params(self) -> str:
        return self._params  # the moved stage's, recorded in the state as without workers


class _PassThrough(DatasetIterator[Any]):
    def __init__(self, parent: DatasetIterator[Any], stage: str) -> None:
        super().__init__(parent)
        self.stage = stage  # type: ignore[misc]

    def __next__(self) -> Any:
        return next(self._parent)

    def _next_many(self, n: int) -> list[Any]:
        return self._parent._next_many(n)

    def _next_columns(self, n: int) -> list[Any] | Columns:
        return self._parent._next_columns(n)
