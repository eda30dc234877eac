"""Provenance of `chute.torch.IterableDataset`'s steps: what torch's `DataLoader` hands out
on one rank, counted from the first epoch's start.

Torch's `DataLoader` with `W` workers takes their outputs in turn (worker 0's first,
worker 1's first, ..., then their second ones), passing over a worker that has ended; each
worker reads its part of the epoch (`IterableDataset.part`), batched. So step `k` is, in
the epoch it falls in, item `t` of worker `w`, found from the number of items each
worker's part has; its records are those of that item of the worker's pipeline, found as
for any pipeline (`core/provenance.py`): from positions, without reading.

The rank and `W` are the state's (`state_dict()` of one copy: its `"shard"` is `[rank,
world size, worker, W]`); a state of another dataset, rank or world size is refused.
"""

from __future__ import annotations

from typing import Any

from chute._src.core import contract
from chute._src.core.errors import CheckpointError
from chute._src.core.provenance import (
    EndOfStream,
    ProvenanceError,
    Tracer,
    length_of,
    records_of,
)
from chute._src.core.state_checks import verify


def _workers(ds: Any, state: Any, any_rank: bool = False) -> int:
    """The number of torch workers the state's copy ran with; CheckpointError where the
    state is not of `ds` on this rank (`any_rank`: on any rank of the same world size)."""
    where = "provenance"
    if not isinstance(state, dict) or "shard" not in state or "pipeline" not in state:
        raise CheckpointError(
            f"{where}: {str(state)[:100]!r} is not a state of chute.torch.IterableDataset: "
            "give what its state_dict() returned (one copy's: in a torch worker, the "
            "worker's)."
        )
    verify(state, where, any_dict=True)
    if state["pipeline"] != list(contract.identity(ds._dataset)):
        raise CheckpointError(
            f"{where}: the state is of the pipeline {state['pipeline']!r}, not of this "
            f"dataset's {list(contract.identity(ds._dataset))!r}: the state is from a "
            "different pipeline; give the dataset the run was built with."
        )
    rank, world, _, workers = state["shard"]
    own = ds.shard_options
    if world != own.shard_count or (rank != own.shard_index and not any_rank):
        raise CheckpointError(
            f"{where}: the state is of rank {rank} of {world}, but the dataset reads rank "
            f"{own.shard_index} of {own.shard_count}: build it with the rank's shard options."
        )
    return int(workers)


def _item(counts: list[int], i: int) -> tuple[int, int]:
    """(worker, item) of the `i`-th item handed out when workers with `counts` items take
    turns; EndOfStream past their sum."""
    t = 0
    while True:
        active = [w for w, c in enumerate(counts) if c > t]
        if not active:
            raise EndOfStream
        if i < len(active):
            return active[i], t
        i -= len(active)
        t += 1


def steps_of(
    ds: Any, state: Any, steps: list[int], any_rank: bool = False
) -> list[list[dict[str, Any]]]:
    """The records of each of `steps` of `ds` (a `chute.torch.IterableDataset`), its
    number of torch workers read from `state`, a copy's state of `ds`'s rank (`any_rank`:
    of any rank of the same run)."""
    workers = _workers(ds, state, any_rank)
    tracer = Tracer()
    epochs: list[tuple[list[Any], list[int]]] = []  # each epoch's pipelines and item counts

    def epoch(e: int) -> tuple[list[Any], list[int]]:
        while len(epochs) <= e:
            pipes = [
                ds._pipeline(ds._fresh_part(w, workers), epoch=len(epochs)) for w in range(workers)
            ]
            epochs.append((pipes, [length_of(p, tracer) for p in pipes]))
        return epochs[e]

    out = []
    try:
        for k in steps:
            e, i = 0, k
            while i >= sum(epoch(e)[1]):
                if sum(epoch(e)[1]) == 0:
                    raise ProvenanceError(f"provenance: {ds!r} has no elements: step {k} is not")
                i -= sum(epoch(e)[1])
                e += 1
            pipes, counts = epoch(e)
            w, t = _item(counts, i)
            out.append(records_of(pipes[w], t, tracer))
    finally:
        tracer.close()
    return out
