"""The states of `chute.torch.IterableDataset`'s copies: their checks, and merging them.

Each copy of the dataset (one per torch worker of each rank) saves its own state
(`COPY_KEYS`); `merge_state_dicts` takes the states of every copy of a run, checks that
they are one run's at one step, and returns what none of them has read (`MERGED_KEYS`),
which every copy of a run with another world size or worker count loads (docs/elastic.md).
`check_copy` and `check_merged` are the checks `load_state_dict` runs too. Nothing here
imports torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from chute._src.core.checkpointing import from_state_dict
from chute._src.core.dataset import INFINITE
from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import check_int
from chute._src.core.state_checks import CHECKSUM_KEY, quote, seal, unseal
from chute._src.frameworks.elastic import rest_of_share, union_of_remaining

__all__ = [
    "COPY_KEYS",
    "MERGED_KEYS",
    "MERGE_FIX",
    "NAME",
    "OLD_COPY_KEYS",
    "check_copy",
    "check_merged",
    "fail",
    "int_list",
    "merge_state_dicts",
]

NAME = "chute.torch.IterableDataset"
COPY_KEYS = frozenset({"epoch", "shard", "pipeline", "length", "part", "read", "iterator"})
"""The keys of one copy's state (and CHECKSUM_KEY)."""
OLD_COPY_KEYS = frozenset({"epoch", "shard", "iterator"})
"""The keys of one copy's state as chute saved it before states could be merged."""
MERGED_KEYS = frozenset(
    {"merged_from", "epoch", "pipeline", "length", "pending", "next_index", "stop", "copies"}
)
"""The keys of a state `merge_state_dicts` returns (and CHECKSUM_KEY)."""
MERGE_FIX = (
    "with another world size or num_workers, restore every copy of the new run from "
    f"{NAME}.merge_state_dicts(the states of all copies of the old run) (docs/elastic.md)"
)


def fail(where: str, path: str, value: Any, rule: str) -> CheckpointError:
    return CheckpointError(
        f"{where}: {path} = {quote(value)} is invalid: {rule}; the state is corrupt: restore "
        f"what {NAME}.state_dict() or merge_state_dicts() returned."
    )


def int_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _check_common(state: dict[str, Any], where: str, path: str) -> None:
    check_int(state, "epoch", f"{where}: {path}")
    check_int(state, "length", f"{where}: {path}", hi=INFINITE)
    if not (
        isinstance(state["pipeline"], list) and all(isinstance(p, str) for p in state["pipeline"])
    ):
        raise fail(where, f"{path}['pipeline']", state["pipeline"], "it must be a list of str")


def check_copy(state: dict[str, Any], where: str, path: str) -> None:
    """Raises `CheckpointError` unless `state` (unsealed) is one copy's state."""
    _check_common(state, where, path)
    shard = state["shard"]
    if not (
        int_list(shard)
        and len(shard) == 4
        and 0 <= shard[0] < shard[1]
        and 0 <= shard[2] < shard[3]
    ):
        raise fail(
            where, f"{path}['shard']", shard, "it must be [rank, world size, worker, workers]"
        )
    part = state["part"]
    if not (isinstance(part, dict) and set(part) == {"pending", "next_index", "stride", "stop"}):
        raise fail(where, f"{path}['part']", part, "it must have pending/next_index/stride/stop")
    stop = check_int(part, "stop", f"{where}: {path}['part']", hi=state["length"])
    check_int(part, "next_index", f"{where}: {path}['part']", hi=INFINITE)
    if part["stride"] != shard[1] * shard[3]:
        raise fail(where, f"{path}['part']['stride']", part["stride"], "it must be R * W")
    if not (int_list(part["pending"]) and all(0 <= i < stop for i in part["pending"])):
        raise fail(where, f"{path}['part']['pending']", part["pending"], f"ints in [0, {stop})")
    check_int(state, "read", f"{where}: {path}")
    if state["iterator"] is not None:
        from_state_dict(state["iterator"])  # checked now, restored by __iter__


def check_merged(state: dict[str, Any], where: str, path: str) -> None:
    """Raises `CheckpointError` unless `state` (unsealed) is what `merge_state_dicts`
    returned."""
    _check_common(state, where, path)
    merged_from = state["merged_from"]
    if not (int_list(merged_from) and len(merged_from) == 2 and min(merged_from) >= 1):
        raise fail(where, f"{path}['merged_from']", merged_from, "[world size, workers]")
    stop = check_int(state, "stop", f"{where}: {path}", hi=state["length"])
    start = check_int(state, "next_index", f"{where}: {path}", hi=stop)
    explicit = state["pending"]
    if not (
        int_list(explicit)
        and all(0 <= a < b for a, b in itertools.pairwise(explicit))
        and (not explicit or 0 <= explicit[-1] < start)
    ):
        raise fail(where, f"{path}['pending']", explicit, f"increasing ints below {start}")
    copies = state["copies"]
    world, workers = merged_from
    if not isinstance(copies, list) or len(copies) != world * workers:
        raise fail(where, f"{path}['copies']", copies, f"a list of {world * workers} states")
    for i, c in enumerate(copies):
        if not (isinstance(c, dict) and set(c) == COPY_KEYS):
            raise fail(where, f"{path}['copies'][{i}]", c, "a copy's state")
        check_copy(c, where, f"{path}['copies'][{i}]")
        if c["shard"][1::2] != merged_from or c["shard"][0] + world * c["shard"][2] != i:
            raise fail(where, f"{path}['copies'][{i}]['shard']", c["shard"], f"copy {i}'s")


def _copy_states(item: Any, where: str) -> list[tuple[str, Any]]:
    """The copy states in one element of `merge_state_dicts`'s argument, with where each is."""
    keys = set(item) - {CHECKSUM_KEY} if isinstance(item, dict) else set()
    if keys in (COPY_KEYS, MERGED_KEYS):
        return [(where, item)]
    if isinstance(item, dict) and "_snapshot" in item:  # StatefulDataLoader, workers
        late = item.get("_steps_since_snapshot", 0)
        if late:
            raise CheckpointError(
                f"{NAME}.merge_state_dicts: {where} is a StatefulDataLoader state taken "
                f"{quote(late)} batches after its workers' last snapshot, so the workers' "
                "states do not say which of those batches were delivered: save with "
                "snapshot_every_n_steps=1 (the default) to restore with another world size."
            )
        snapshots = (
            item["_snapshot"].get("_worker_snapshots")
            if isinstance(item["_snapshot"], dict)
            else None
        )
        if isinstance(snapshots, dict) and all(isinstance(w, dict) for w in snapshots.values()):
            return [
                (
                    f"{where}['_snapshot']['_worker_snapshots'][{k!r}]['dataset_state']",
                    w.get("dataset_state"),
                )
                for k, w in snapshots.items()
            ]
    elif isinstance(item, dict) and "dataset_state" in item:  # StatefulDataLoader, no workers
        return [(f"{where}['dataset_state']", item["dataset_state"])]
    raise CheckpointError(
        f"{NAME}.merge_state_dicts: {where} = {quote(item)} is neither a {NAME} state "
        "(state_dict()) nor a torchdata StatefulDataLoader's state_dict() over one: pass, "
        "for every rank of the old run, its loader's state_dict() (or every copy's "
        "dataset state)."
    )


def merge_state_dicts(states: Sequence[Any]) -> dict[str, Any]:
    """See `IterableDataset.merge_state_dicts`."""
    who = f"{NAME}.merge_state_dicts"
    if isinstance(states, dict) or not isinstance(states, Sequence) or not states:
        raise ValueError(
            f"{who} got {quote(states)}: pass a non-empty list of the states of every rank "
            "of the old run (each rank's StatefulDataLoader state_dict(), or every copy's "
            "dataset state_dict())."
        )
    found = [c for i, item in enumerate(states) for c in _copy_states(item, f"states[{i}]")]
    copies: list[dict[str, Any]] = []
    for where, s in found:
        if not (isinstance(s, dict) and set(s) - {CHECKSUM_KEY} == COPY_KEYS):
            raise CheckpointError(
                f"{who}: {where} = {quote(s)} is not one copy's {NAME} state"
                + (
                    ": it is a merged state, which no copy has read from yet: load it into "
                    "every copy of the new run as it is"
                    if isinstance(s, dict) and set(s) - {CHECKSUM_KEY} == MERGED_KEYS
                    else ""
                )
                + "; pass the states all copies of one run saved at one step."
            )
        s = unseal(s, who, where, any_dict=True)
        check_copy(s, who, where)
        copies.append(s)
    first = copies[0]
    world, workers = first["shard"][1], first["shard"][3]
    m = world * workers
    for (where, _), s in zip(found, copies):
        for key, value, expected in (
            ("['pipeline']", s["pipeline"], first["pipeline"]),
            ("['length']", s["length"], first["length"]),
            ("['shard'][1::2]", s["shard"][1::2], [world, workers]),
        ):
            if value != expected:
                raise CheckpointError(
                    f"{who}: {where}{key} = {quote(value)} differs from the first state's "
                    f"{quote(expected)}: the states must come from one run (same dataset, "
                    "world size and num_workers); pass the states all its copies saved at "
                    "one step."
                )
    places = sorted(s["shard"][0] + world * s["shard"][2] for s in copies)
    if places != list(range(m)):
        missing = [j for j in range(m) if j not in places][:20]
        repeated = sorted({j for j in places if places.count(j) > 1})[:20]
        raise CheckpointError(
            f"{who}: got {len(copies)} states of a run of {world} ranks x {workers} workers "
            f"= {m} copies (copy r + {world}*k for rank r, worker k), missing copies "
            f"{missing}, repeated {repeated}: every copy's state is needed exactly once "
            "(each knows only what it has read itself); pass the loader states of all "
            f"{world} ranks."
        )
    copies.sort(key=lambda s: s["shard"][0] + world * s["shard"][2])
    epoch = min(s["epoch"] for s in copies)
    at_epoch = [s for s in copies if s["epoch"] == epoch]
    stop = at_epoch[0]["part"]["stop"]
    for s in copies:
        if s["epoch"] == epoch and s["part"]["stop"] != stop:
            raise fail(who, "a state's ['part']['stop']", s["part"]["stop"], f"all are {stop}")
        if s["epoch"] != epoch and (s["epoch"] != epoch + 1 or s["read"]):
            raise CheckpointError(
                f"{who}: the states are of epoch {epoch} and of epoch {s['epoch']} with "
                f"{s['read']} positions read: copies of one run at one step are at most one "
                "epoch apart, those ahead at its start; pass the states all copies of one "
                "run saved at one step."
            )
    parts = [
        rest_of_share(s["part"]["pending"], s["part"]["next_index"], m, s["read"])
        if s["epoch"] == epoch
        else ([], stop)  # it has read all its share of the epoch
        for s in copies
    ]
    explicit, start = union_of_remaining(
        parts,
        m,
        stop,
        who=who,
        readers="copies",
        fix="pass the states all copies of one run saved at one step",
    )
    merged: dict[str, Any] = seal(
        {
            "merged_from": [world, workers],
            "epoch": epoch,
            "pipeline": first["pipeline"],
            "length": first["length"],
            "pending": explicit,
            "next_index": start,
            "stop": stop,
            "copies": copies,
        },
        any_dict=True,
    )
    return merged
