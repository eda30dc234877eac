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

from typing import Any

from chute._src.core import observe
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator
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
    hoisted: list[IterDataset[Any]] = []
    node: IterDataset[Any] = ds
    while node.role is StageRole.ELEMENT_WISE:
        hoisted.append(node)
        node = node.parents[0]  # type: ignore[assignment]
    shards: list[IterDataset[Any]] = list(node.parents)  # type: ignore[arg-type]
    if node.reads_shards and not any(has_reader(p) for p in shards):
        # A stream of shards (`_src/exec/workers/shards.py`): each shard read whole in a worker.
        streams.append(ShardStream(shards, hoisted))
        s = len(streams) - 1
        merged = node.with_parents([WorkerShard(p, s, j, box) for j, p in enumerate(shards)])
        if hoisted:
            merged = DropHoles(merged)
        for stage in reversed(hoisted):
            merged = DoneInWorkers(merged, stage.stage_name, stage.position_params)
        return merged
    if node.role is StageRole.READER:
        kept: list[IterDataset[Any]] = []
        # A reader (`_src/core/contract.py`, READER) that hands filtered elements on as None:
        if node.allow_nones:  # type: ignore[attr-defined]
            # The stages above see the Nones: they stay in the main process, as they are.
            hoisted, kept = [], hoisted
        mapped: MapDataset[Any] = node.parents[0]  # type: ignore[assignment]
        for stage in reversed(hoisted):
            mapped = stage.as_map_stage(mapped)
        observer = observe.observing()
        if observer is not None:
            mapped = observer.map_chain(mapped)
        leaves.append(mapped)
        leaf_id = len(leaves) - 1

        def executor(leaf: MapDataset[Any] = mapped, leaf_id: int = leaf_id) -> ChunkExecutor:
            assert box.service is not None, "a worker-fed reader iterated before the service"
            return WorkerChunks(leaf, leaf_id, box.service)

        out: IterDataset[Any] = node.with_executor(executor)  # type: ignore[attr-defined]
        for stage in reversed(hoisted):
            out = DoneInWorkers(out, stage.stage_name, stage.position_params)
        for stage in reversed(kept):
            out = stage.with_parents([out])
        return out
    return ds.with_parents(
        [
            substitute(p, leaves, streams, box) if isinstance(p, IterDataset) else p
            for p in ds.parents
        ]
    )


class DoneInWorkers(IterDataset[Any]):
    """Stands where a `map`/`filter` was that now runs in the workers: a pass-through with
    the same stage name, so the state has the same shape as without workers."""

    role = StageRole.PASS_THROUGH
    internal = True

    def __init__(self, parent: IterDataset[Any], stage: str, params: str) -> None:
        super().__init__([parent])
        self._stage = stage
        self._params = params

    def make_iterator(self) -> DatasetIterator[Any]:
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
