"""Streams split by shard across `mp_prefetch`'s worker processes.

A stage that `reads_shards` (an interleave: `InterleaveIterDataset`, the file streams)
merges whole shards, each read on its own, by its own rule. Under `mp_prefetch` each shard
is read in a worker, with the element-wise stages directly above the merge (`map`,
`filter`) applied there, element by element; the merge itself, and everything above it,
stays in the main process and sees the same elements in the same order as with no workers:

- A filtered-out element comes back as a `HOLE`, so it still takes its turn in the merge
  (as it does when the filter runs after the merge), and `DropHoles` removes it after.
- The merge asks a shard for `n` elements at a time, from a state it recorded; a worker
  reads a shard in whole steps of `n` raw elements and returns the shard's state after
  each, so the merge's state (the shards' states and the cycle) is exactly the in-process
  one and restores with any number of workers.

A shard stays on the worker that first read it, which keeps it open between requests; a
restore sends the state to start from.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from chute._src.core import contract, observe
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset, walk
from chute._src.core.iterator import DatasetIterator
from chute._src.exec.mp.transport import RemoteFailure
from chute._src.exec.workers.tasks import ShardResult, ShardTask

if TYPE_CHECKING:
    from chute._src.exec.workers.backend import ChunkBackend
    from chute._src.exec.workers.service import Ticket

_DEPTH = 2  # requests in flight per open shard
_TARGET_S = 0.02  # a request should take a worker about this long
_MAX_STEPS = 256  # steps of n elements in one request


class _Hole:
    """An element a filter moved into the workers rejected (it still takes its turn)."""

    def __reduce__(self) -> str:
        return "HOLE"  # unpickles as this module's HOLE

    def __repr__(self) -> str:
        return "HOLE"


HOLE = _Hole()


def has_reader(ds: IterDataset[Any]) -> bool:
    """Whether `ds`'s graph has a random-access part (a READER), which workers compute by
    index chunks instead."""
    return any(contract.role(node) is StageRole.READER for node in walk(ds))


class _Items(MapDataset[Any]):
    """The raw elements of one step of a shard, at their positions in the shard, as the
    source of the element-wise stages moved into the worker."""

    _role = StageRole.SOURCE
    _internal = True

    def __init__(self) -> None:
        super().__init__()
        self.items: list[Any] = []
        self.base = 0

    def __len__(self) -> int:
        return self.base + len(self.items)

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        items, base = self.items, self.base
        return [items[i - base] for i in indices.tolist()]


class ShardStream:
    """What the workers receive for one merge: its shards and the stages moved above them.

    `moved`: each moved stage as the workers run it (its MapDataset form), bottom first.
    In debug mode the observer's copies (`observe.py`: `shard`, `stream_chain`) are sent, so
    the workers time the shards and the moved stages; `observed()` lists them."""

    def __init__(self, shards: list[IterDataset[Any]], moved: list[Any]) -> None:
        self.shards = shards
        self.items = _Items()
        chain: MapDataset[Any] = self.items
        self.moved: list[MapDataset[Any]] = []
        for stage in reversed(moved):  # `moved` is top first
            chain = contract.element_wise(stage)._as_map_stage(chain)
            self.moved.append(chain)
        self.chain: MapDataset[Any] | None = chain if moved else None
        observer = observe.observing()
        if observer is not None:
            self.shards = [observer.shard(shard) for shard in shards]
            if self.chain is not None:
                self.chain = observer.stream_chain(self.chain)

    def observed(self) -> list[Any]:
        """The shards and the chain of moved stages, as the observer's figures come from."""
        return [*self.shards, *([self.chain] if self.chain is not None else [])]


class ShardReader:
    """The worker side: open shard iterators, kept between requests."""

    def __init__(
        self, streams: list[ShardStream], take_figures: Callable[[], list[Any]] | None = None
    ) -> None:
        self._streams = streams
        self._open: dict[tuple[int, int], tuple[DatasetIterator[Any], int]] = {}
        self._take_figures = take_figures  # debug mode's, sent back with each result

    def __call__(self, task: ShardTask) -> ShardResult:
        s, j, start, n, steps = task.stream, task.shard, task.start, task.n, task.steps
        t0 = time.perf_counter()
        stream = self._streams[s]
        out: list[tuple[list[Any], Any]] = []
        ended = False
        failure: RemoteFailure | None = None
        it: DatasetIterator[Any] | None = None
        count = 0
        try:
            if start is None:
                it, count = self._open.pop((s, j))
            else:
                self._open.pop((s, j), None)
                it = stream.shards[j]._iter()
                if start != "initial":
                    it._restore(start, "state")
            for _ in range(steps):
                raw = it._next_many(n)
                items = raw
                if stream.chain is not None and raw:
                    stream.items.items, stream.items.base = raw, count
                    got = stream.chain._getitems(np.arange(count, count + len(raw)))
                    items = [HOLE if x is None else x for x in got]
                count += len(raw)
                if len(raw) < n:
                    ended = True
                    out.append((items, None))
                    break
                out.append((items, it.get_state()))
        except Exception as e:
            e.add_note(
                f"chute: raised reading shard {j} ({stream.shards[j]!r}) in a worker, "
                f"{count} elements after where the shard was "
                + ("opened" if start in (None, "initial") else "restored")
            )
            failure = RemoteFailure.capture(e)
            it = None
        if it is not None and not ended:
            self._open[(s, j)] = (it, count)
        elif it is not None:
            it.close()
        figures = self._take_figures() if self._take_figures is not None else []
        return ShardResult(time.perf_counter() - t0, out, ended, failure, figures)


class WorkerShard(IterDataset[Any]):
    """Stands for one shard of a merge under `mp_prefetch`: its elements come from a worker."""

    _role = StageRole.SOURCE
    _internal = True

    def __init__(
        self, shard: IterDataset[Any], stream: int, index: int, service: ChunkBackend
    ) -> None:
        super().__init__()
        self._shard = shard
        self._stream = stream
        self._index = index
        self._service = service

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _WorkerShardIterator(self)

    @property
    def _stands_for(self) -> IterDataset[Any]:
        """The shard this stands for: the debug layer's figures show its stages, read in a
        worker, in this one's place."""
        return self._shard

    def __repr__(self) -> str:
        return f"{self._shard!r} (read in a worker)"


class _WorkerShardIterator(DatasetIterator[Any]):
    """Hands out the shard in whole steps of `n` elements, so its state (the shard's own,
    after the last step handed out) is always exact."""

    bound_to_thread = True

    def __init__(self, ds: WorkerShard) -> None:
        super().__init__()
        self._ds = ds
        local = ds._shard._iter()  # the shard's initial state, and what checks restores
        self.stage = local.stage  # type: ignore[misc]
        self._state: Any = local.get_state()
        local.close()
        self._start: Any = "initial"  # what the next request starts from (None: goes on)
        self._n = 0
        self._steps = 1
        self._pending: deque[Ticket] = deque()
        self._ready: deque[tuple[list[Any], Any]] = deque()
        self._ended = False  # the last step has been received
        self._failure: BaseException | None = None

    def _restart(self, n: int, start: Any = None) -> None:
        """Drops what was asked ahead; the next request starts from `start`, or from the
        current state."""
        service = self._ds._service
        for ticket in self._pending:
            service.discard(ticket)
        self._pending.clear()
        self._ready.clear()
        if start is not None:
            self._start = start
        elif self._start is None:  # a request went out since the last start
            self._start = self._state
        self._n, self._ended, self._failure = n, False, None

    def _request(self) -> None:
        service = self._ds._service
        while not self._ended and len(self._pending) < _DEPTH:
            task = ShardTask(self._ds._stream, self._ds._index, self._start, self._n, self._steps)
            self._pending.append(service.submit_stream(task))
            self._start = None

    def _receive(self) -> None:
        ticket = self._pending.popleft()
        result, failure = self._ds._service.stream_result(ticket)
        elapsed, ended = result.seconds, result.ended
        self._ready.extend(result.steps)
        if failure is not None:
            self._failure, ended = failure, True
        if ended:
            self._ended = True
            for t in self._pending:
                self._ds._service.discard(t)
            self._pending.clear()
        elif elapsed < _TARGET_S / 2 and self._steps < _MAX_STEPS:
            self._steps *= 2
        elif elapsed > _TARGET_S * 2 and self._steps > 1:
            self._steps //= 2

    def _next_many(self, n: int) -> list[Any]:
        if n != self._n:
            self._restart(n)
        while not self._ready:
            if self._ended:
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    raise failure
                return []
            self._request()
            self._receive()
        self._request()
        items, state = self._ready.popleft()
        if state is not None:
            self._state = state
        return items

    def __next__(self) -> Any:
        got = self._next_many(1)
        if not got:
            raise StopIteration
        return got[0]

    def get_state(self) -> Any:
        return self._state

    def _restore(self, state: Any, path: str) -> None:
        local = self._ds._shard._iter()  # checked here: a bad state raises CheckpointError
        try:
            local._restore(state, path)
        finally:
            local.close()
        self._state = state
        self._restart(self._n, state)

    def set_state(self, state: Any) -> None:
        self._restore(state, "state")

    def close(self) -> None:
        self._pending.clear()  # the workers belong to the mp_prefetch stage, which stops them
        self._ready.clear()


class DropHoles(IterDataset[Any]):
    """Removes the elements filters in the workers rejected; nothing else (no state)."""

    _role = StageRole.PASS_THROUGH
    _internal = True

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _DropHolesIterator(self._parent_iter())

    def __repr__(self) -> str:
        return "DropHoles"


class _DropHolesIterator(DatasetIterator[Any]):
    transparent = True

    def __next__(self) -> Any:
        while True:
            x = next(self._parent)
            if x is not HOLE:
                return x

    def _next_many(self, n: int) -> list[Any]:
        out: list[Any] = []
        while len(out) < n:
            got = self._parent._next_many(n - len(out))
            if not got:
                break
            out.extend(x for x in got if x is not HOLE)
        return out
