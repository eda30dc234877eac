"""The rewrite that moves a pipeline into the workers, in two steps around the start of
the workers.

`WorkerPlan(ds)` finds, in the pipeline above an `mp_prefetch` stage, what the workers
compute: each reader's (`to_iter_dataset`, a READER) MapDataset, the leaf, and each
stream of shards (a stage that `reads_shards`), with the element-wise stages directly
above either moved into them. The service is started on those (`leaves`, `streams`:
`options.start_service`). `plan.build(service)` then copies the pipeline with each
reader getting its chunks from the service (`feeding.WorkerChunks`), each shard read in
a worker (`shards.WorkerShard`), and a `DoneInWorkers` where a moved stage was, so that
states keep their shape. Everything else (the order-dependent stages) stays in the main
process, on the same elements in the same order as without workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from chute._src.core import contract, observe
from chute._src.core.columns import Columns
from chute._src.core.contract import ElementWise, StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.core.node import rewrite, walk
from chute._src.exec.workers.backend import ChunkBackend
from chute._src.exec.workers.feeding import WorkerChunks
from chute._src.exec.workers.shards import DropHoles, ShardStream, WorkerShard, has_reader

Build = Callable[[ChunkBackend], IterDataset[Any]]


class WorkerPlan:
    """What of `ds` the workers compute (`leaves`, `streams`), found before they start, and
    `ds` rebuilt on the service that runs them (`build`; see the module's docstring)."""

    def __init__(self, ds: IterDataset[Any]) -> None:
        self.leaves: list[MapDataset[Any]] = []
        self.streams: list[ShardStream] = []
        self._ds = ds
        self._builds: dict[int, Build] = {}  # by id: each stage the workers take over
        for node in walk(ds, _moved):
            if isinstance(node, IterDataset) and _fed_by_workers(node):
                hoisted, base = _element_wise_chain(node)
                if contract.role(base) is StageRole.READER:
                    self._builds[id(node)] = self._worker_fed_reader(base, hoisted)
                else:
                    self._builds[id(node)] = self._worker_read_shards(base, hoisted)

    def build(self, service: ChunkBackend) -> IterDataset[Any]:
        """A copy of the pipeline whose readers and shards get their elements from
        `service` (started on `leaves` and `streams`)."""

        def to_workers(node: Any) -> Any:
            build = self._builds.get(id(node))
            return node if build is None else build(service)

        return rewrite(self._ds, to_workers, stop=_moved)

    def _worker_read_shards(self, node: IterDataset[Any], hoisted: list[ElementWise]) -> Build:
        """A stream of shards (`shards.py`): each shard read whole in a worker."""
        shards: list[IterDataset[Any]] = list(node.parents)  # type: ignore[arg-type]
        stream = ShardStream(shards, hoisted)
        self.streams.append(stream)
        s = len(self.streams) - 1

        def build(service: ChunkBackend) -> IterDataset[Any]:
            merged = contract.with_parents(
                node, [WorkerShard(p, s, j, service) for j, p in enumerate(shards)]
            )
            if hoisted:
                merged = DropHoles(merged)
            for stage, moved in zip(reversed(hoisted), stream.moved):
                params = contract.position_params(stage)
                merged = DoneInWorkers(merged, stage._stage_name, params, moved)
            return merged

        return build

    def _worker_fed_reader(self, node: IterDataset[Any], hoisted: list[ElementWise]) -> Build:
        """A reader whose chunks workers compute, the element-wise stages above it applied
        in the workers to its MapDataset (the leaf)."""
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
        self.leaves.append(mapped)
        leaf_id = len(self.leaves) - 1

        def build(service: ChunkBackend) -> IterDataset[Any]:
            out: IterDataset[Any] = reader._with_executor(
                lambda: WorkerChunks(mapped, leaf_id, service)
            )
            for stage, done in zip(reversed(hoisted), moved):
                params = contract.position_params(stage)
                out = DoneInWorkers(out, stage._stage_name, params, done)
            for stage in reversed(kept):
                out = cast("IterDataset[Any]", contract.with_parents(stage, [out]))
            return out

        return build


def _moved(node: Any) -> bool:
    """What `rewrite` hands over whole, with all below it."""
    return not isinstance(node, IterDataset) or _fed_by_workers(node)


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
