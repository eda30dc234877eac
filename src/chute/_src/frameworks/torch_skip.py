"""`skip` and `skip_state` for `chute.torch.IterableDataset`: move a copy, or a whole torch
`DataLoader` over it, `n` steps on, as if those steps had been read.

A copy reads its share of the epoch, batched (`IterableDataset._pipeline`); its state says
how many positions of the share it has read. Moving it `t` batches on is `skip` of its chute
pipeline, restored from the state: O(1) where positions are index arithmetic, the batches
read and dropped where they are not (a filter of the MapDataset). The moved state is the
rest of the share after the positions those batches took (`rest_of_share`), read from its
start, which yields what the copy would have yielded next.

torch's `DataLoader` with `W` workers takes their batches in turn, passing over a worker
that has ended, starting after the worker that gave the last batch; torchdata's
`StatefulDataLoader` records which one that was and every worker's copy state. Moving it
`n` steps is moving each worker's copy by its number of those steps, found from the
number of batches each has left (`length_of`, as `provenance` finds it). A loader reads
one epoch per iteration, so the move stops at the epoch's end.
"""

from __future__ import annotations

import copy
from typing import Any

from chute._src.core import contract
from chute._src.core.errors import CheckpointError
from chute._src.core.next_index import _reader_path
from chute._src.core.provenance import ProvenanceError, Tracer, length_of
from chute._src.core.state_checks import CHECKSUM_KEY, quote, seal
from chute._src.frameworks.elastic import rest_of_share
from chute._src.frameworks.torch_states import COPY_KEYS, MERGED_KEYS, NAME, OLD_COPY_KEYS

# The keys of torchdata's StatefulDataLoader states (its private names, which it saves).
_SNAPSHOT = "_snapshot"
_WORKER_SNAPSHOTS = "_worker_snapshots"
_MAIN_SNAPSHOT = "_main_snapshot"
_SNAPSHOT_STEP = "_snapshot_step"
_LAST_WORKER = "_last_yielded_worker_id"
_SINCE = "_steps_since_snapshot"
_YIELDED = "_sampler_iter_yielded"
_NUM_YIELDED = "_num_yielded"
_DATASET_STATE = "dataset_state"


def copy_states(state: Any) -> list[Any]:
    """The copy states in `state`: one copy's `state_dict()`, or a `StatefulDataLoader`'s
    (one per worker, in worker order)."""
    if isinstance(state, dict) and isinstance(state.get(_SNAPSHOT), dict):
        workers = state[_SNAPSHOT].get(_WORKER_SNAPSHOTS)
        if isinstance(workers, dict) and workers:
            keys = sorted(workers, key=lambda k: int(str(k).rpartition("_")[2] or 0))
            return [workers[k].get(_DATASET_STATE) for k in keys]
    if isinstance(state, dict) and _DATASET_STATE in state and _NUM_YIELDED in state:
        return [state[_DATASET_STATE]]
    return [state]


class _Copy:
    """One copy's state, checked as `load_state_dict` checks it, and what is left of its
    share of the epoch."""

    def __init__(self, ds: Any, state: Any, where: str) -> None:
        keys = set(state) - {CHECKSUM_KEY} if isinstance(state, dict) else set()
        if keys == MERGED_KEYS:
            raise CheckpointError(
                f"{where}: the state is what {NAME}.merge_state_dicts returned, which no copy "
                "has read from yet: load it into the copies of the new run, read from them, "
                "and skip on the state they then save (or on the live iterator)."
            )
        if keys not in (COPY_KEYS, OLD_COPY_KEYS):
            raise CheckpointError(
                f"{where}: {quote(state)} is not a state of {NAME}: give one copy's "
                "state_dict(), or the state_dict() of the torchdata StatefulDataLoader "
                "reading it (every worker's copy is in it)."
            )
        self.state = state
        self.clone = copy.copy(ds)  # load_state_dict runs every check of a restore
        self.clone.load_state_dict(state)
        loaded = self.clone._pending
        self.epoch = int(loaded["epoch"])
        self.shard = list(loaded["shard"])
        self.worker, self.workers = self.shard[2], self.shard[3]
        part, _, read = self.clone._start(loaded, self.worker, self.workers)
        pending, next_index = rest_of_share(part.pending, part.next_index, part.stride, read)
        self.rest = type(part)(pending, next_index, part.stride, part.stop)

    def batches_left(self, tracer: Tracer) -> int:
        """The batches left in the copy's share: found from positions (`length_of`), or,
        where a stage of the user's does not say where its elements come from, counted by
        reading them."""
        pipeline = self.clone._pipeline(self.rest, epoch=self.epoch)
        try:
            return length_of(pipeline, tracer)
        except ProvenanceError:
            it = iter(pipeline)
            try:
                return sum(1 for _ in it)
            finally:
                it.close()

    def moved(self, batches: int) -> tuple[dict[str, Any], int]:
        """The copy's state after `batches` more of its batches, and how many it had (fewer
        at its share's end)."""
        from chute._src.core.skip import skip

        it = iter(self.clone._pipeline(self.rest, epoch=self.epoch))
        try:
            done = skip(it, batches)
            used = int(_reader_path(it.get_state(), "skip_state")[-1]["next_index"])
        finally:
            it.close()
        r = self.rest
        pending, next_index = rest_of_share(r.pending, r.next_index, r.stride, used)
        state: dict[str, Any] = seal(
            {
                "epoch": self.epoch,
                "shard": self.shard,
                "pipeline": list(contract.identity(self.clone._dataset)),
                "length": len(self.clone._dataset),
                "part": type(r)(pending, next_index, r.stride, r.stop).as_json(),
                "read": 0,
                "iterator": None,
            },
            any_dict=True,
        )
        return state, done


def _turns(left: list[int], first: int, n: int) -> tuple[list[int], int, int]:
    """How many of `n` turns each worker takes, workers with `left` items taking turns
    from worker `first` on and passing over those that have ended: (taken, the worker of
    the last turn or -1, turns taken)."""
    workers = len(left)
    order = [(first + i) % workers for i in range(workers)]
    taken, last, todo = [0] * workers, -1, n
    while todo:
        active = [w for w in order if left[w] > taken[w]]
        if not active:
            break
        rounds = min(todo // len(active), min(left[w] - taken[w] for w in active))
        if rounds:
            for w in active:
                taken[w] += rounds
            todo -= rounds * len(active)
            last = active[-1]
            continue
        for w in active[:todo]:  # a last, partial round
            taken[w] += 1
            last = w
        todo = 0
    return taken, last, n - todo


def skip_state(ds: Any, state: Any, n: int) -> Any:
    """`state` moved `n` steps on: one copy's `state_dict()` (of a copy that is its rank's
    only one: `num_workers=0`), or a torchdata `StatefulDataLoader`'s `state_dict()`."""
    where = "skip_state"
    if isinstance(state, dict) and isinstance(state.get(_SNAPSHOT), dict):
        return _skip_workers(ds, state, n, where)
    if isinstance(state, dict) and _DATASET_STATE in state and _NUM_YIELDED in state:
        one = _Copy(ds, state[_DATASET_STATE], f"{where}: state['dataset_state']")
        moved, taken, _ = _skip_copies([one], 0, n)
        out = dict(state)
        out[_DATASET_STATE] = moved[0]
        out[_NUM_YIELDED] = int(state[_NUM_YIELDED]) + taken
        out[_YIELDED] = int(state.get(_YIELDED, 0)) + taken
        return out
    one = _Copy(ds, state, where)
    if one.workers != 1:
        raise ValueError(
            f"{where}: the state is of torch worker {one.worker} of {one.workers}, whose "
            "batches the DataLoader interleaves with the other workers': skipping the "
            "loader's steps needs every worker's state: give the torchdata "
            "StatefulDataLoader's state_dict() (or read with num_workers=0)."
        )
    return _skip_copies([one], 0, n)[0][0]


def _skip_copies(copies: list[_Copy], first: int, n: int) -> tuple[list[Any], int, int]:
    """Each copy's state after the loader's next `n` steps (workers taking turns from
    `first`): (states, steps taken, the worker of the last step or -1). One copy takes
    every step, as far as its share goes; several share them out by how many batches each
    has left."""
    if len(copies) == 1:
        state, done = copies[0].moved(n)
        return [state], done, 0
    # A copy ahead of the others by an epoch has read all its share of this one (and
    # starts the next only in the loader's next iteration): it takes no turn.
    epoch = min(c.epoch for c in copies)
    tracer = Tracer()
    try:
        left = [c.batches_left(tracer) if c.epoch == epoch else 0 for c in copies]
    finally:
        tracer.close()
    taken, last, done = _turns(left, first, n)
    moved = [c.moved(t)[0] if c.epoch == epoch else c.state for c, t in zip(copies, taken)]
    return moved, done, last


def _skip_workers(ds: Any, state: dict[str, Any], n: int, where: str) -> dict[str, Any]:
    snapshot = state[_SNAPSHOT]
    workers = snapshot.get(_WORKER_SNAPSHOTS)
    if not isinstance(workers, dict) or not workers:
        raise CheckpointError(
            f"{where}: the StatefulDataLoader state holds no worker snapshots "
            f"({quote(snapshot)}): give the state_dict() of a loader that has started "
            "its workers (after its first batch)."
        )
    keys = sorted(workers, key=lambda k: int(str(k).rpartition("_")[2] or 0))
    copies = [
        _Copy(ds, workers[k].get(_DATASET_STATE), f"{where}: {k}'s dataset_state") for k in keys
    ]
    count = len(copies)
    if [c.worker for c in copies] != list(range(count)) or {c.workers for c in copies} != {count}:
        raise CheckpointError(
            f"{where}: the worker snapshots {keys} hold the copies "
            f"{[c.shard for c in copies]}, not workers 0..{count - 1} of {count}: give "
            "the state_dict() of one StatefulDataLoader, as it saved it."
        )
    # Steps read since the workers' snapshot are moved over too: the state restores at the
    # snapshot, then reads them.
    total = n + int(state.get(_SINCE, 0))
    first = (int(snapshot[_LAST_WORKER]) + 1) % count
    moved, done, last = _skip_copies(copies, first, total)
    out = copy.deepcopy(state)
    snap = out[_SNAPSHOT]
    for k, m in zip(keys, moved):
        snap[_WORKER_SNAPSHOTS][k][_DATASET_STATE] = m
    snap[_SNAPSHOT_STEP] = int(snapshot[_SNAPSHOT_STEP]) + done
    if last >= 0:
        snap[_LAST_WORKER] = last
    main = snap.get(_MAIN_SNAPSHOT)
    if isinstance(main, dict) and _YIELDED in main:
        main[_YIELDED] = int(main[_YIELDED]) + done
    out[_SINCE] = 0
    return out
