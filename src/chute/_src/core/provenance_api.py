"""`chute.experimental.provenance`: the records behind steps, from an iterator or a state.

Steps count from the pipeline's start (step `k` is the `k`-th thing it yields), whatever
position the iterator or state is at: the state only says which pipeline it belongs to,
checked as `set_state` checks it. The records are found from positions and seeds by each
stage's `_origins` (`core/provenance.py`); nothing is read but what a filtering or
length-grouping stage must see.

`hosts=` names every host's pipeline (each built with its shard options): the state is
checked against its own host's, and each step lists every host's records (`every_host`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from chute._src.core.iterator import DatasetIterator, ThreadGuardedIterator
from chute._src.core.provenance import ByMixture, ProvenanceError, changes_by_mixture, trace_steps


def _steps(steps: object) -> list[int]:
    """`steps` as a list of ints >= 0 (an int, a range, any iterable of ints)."""
    items: Iterable[Any] = [steps] if isinstance(steps, int) else steps  # type: ignore[assignment]
    if isinstance(steps, str | bytes) or not isinstance(items, Iterable):
        raise TypeError(
            f"provenance: steps={steps!r} is invalid: give a step (an int), a range of steps "
            "(range(100, 110)) or a list of them."
        )
    out = []
    for k in items:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(
                f"provenance: step {k!r} is invalid: steps are ints >= 0, counted from the "
                "pipeline's start (step 0 is the first thing it yields)."
            )
        out.append(int(k))
    return out


def _pipeline_of(dataset: Any) -> Any:
    """The IterDataset a dataset or a `DataLoader` (its `dataset`) iterates."""
    inner = getattr(dataset, "dataset", None)
    if inner is not None and hasattr(inner, "_origins"):
        return inner
    if not hasattr(dataset, "_origins"):
        raise TypeError(
            f"provenance: dataset={dataset!r} is not a chute pipeline: give the IterDataset "
            "(or DataLoader) the iterator or state came from."
        )
    if not hasattr(dataset, "_make_iterator"):  # a MapDataset: steps are its indices
        return dataset.to_iter_dataset()
    return dataset


def _named(dataset: Any, found: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    """The records as `dataset` names them: a layer that builds its pipeline over keys of
    its own (the `DataLoader` over a sampler of the user's) declares `_name_records`."""
    name = getattr(dataset, "_name_records", None)
    return name(found) if callable(name) else found


def _state_of(state: Any) -> Any:
    """A state as `get_state()` gives it, from itself or a `state_dict()`."""
    if isinstance(state, Mapping) and set(state) == {"chute_state"}:
        from chute._src.core.checkpointing import from_state_dict

        return from_state_dict(dict(state))
    return state


def _restored(state: Any, dataset: Any) -> ByMixture | None:
    """Restores `state` into a fresh iterator of `dataset` (CheckpointError where it is not
    of that pipeline, as `set_state` would) and returns its mixtures' weight changes."""
    # A fresh iterator: `iter(ds)` of a stage that is its own iterator (ElasticIterator)
    # would be the user's, moved by the check.
    fresh = getattr(dataset, "_iter", None)
    it = ThreadGuardedIterator(fresh()) if fresh is not None else iter(dataset)
    try:
        it.set_state(state)
        return changes_by_mixture(_pipeline_of(dataset), it)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def provenance(
    it_or_state: Any, steps: Any, dataset: Any = None, *, hosts: Mapping[Any, Any] | None = None
) -> list[list[dict[str, Any]]]:
    """The source records behind each of `steps`: one list per step, of one mapping per
    record, in the order the step holds them.

    Each record has `source` (the component's name under a mix, its position under an
    unnamed mix or a concatenation, None for a single source), `index` (the record's index
    in that source), `epoch`, `offset` (where it sits in the step: its row in a batch,
    its row and first token in a packed row; empty for an element) and, for record files
    (`record_location`), `file`, `shard` and `record`. Step `k` is the `k`-th thing the
    pipeline yields from its start, whatever position `it_or_state` is at.

    `it_or_state`: a live iterator (of an `IterDataset` or a `DataLoader`), or a state
    (`get_state()`, a JSON checkpoint, the state restored from Orbax, a `state_dict()`),
    which needs `dataset=` (the pipeline it came from; a state of another pipeline raises
    `CheckpointError`). For `chute.torch.IterableDataset`, give the `state_dict()` of one
    of its copies (or of the torchdata `StatefulDataLoader` reading it) and the dataset:
    the steps are those torch's `DataLoader` hands out on that rank, its workers taking
    turns. Through a `DataLoader` over a sampler of the user's (not an `IndexSampler`),
    `index` is the `record_key` the sampler gives for the step, `sampler_index` the step
    and `epoch` None.

    `hosts`: every host's records, for a run that shards its data over hosts: a mapping
    of each host's label (its process index, say) to its pipeline, built with that host's
    shard options as for the run (`dataset=` is then left out). The state (or iterator)
    is one host's, checked against that host's pipeline (a state of none of them raises
    `CheckpointError`); each step then lists every host's records of that step, host
    after host in the mapping's order, each record with `host`: its label.

    >>> import chute
    >>> ds = chute.MapDataset.range(100).seed(0).shuffle().batch(2).to_iter_dataset()
    >>> [r["index"] for r in provenance(iter(ds), 3)[0]]
    [99, 67]
    >>> list(ds)[3].tolist()
    [99, 67]
    """
    wanted = _steps(steps)
    if isinstance(it_or_state, Iterator) and not isinstance(it_or_state, DatasetIterator):
        raise TypeError(
            f"provenance: {it_or_state!r} is not the iterator of a chute pipeline, so its "
            "position is not known: give its saved state and the dataset, "
            "provenance(state, steps, dataset=ds) (for a torch DataLoader over "
            "chute.torch.IterableDataset: the StatefulDataLoader's state_dict(), or the "
            "dataset's with num_workers=0)."
        )
    if hosts is not None:
        if dataset is not None:
            raise ValueError(
                "provenance: both dataset= and hosts= were given: with hosts=, the state is "
                "matched to the host whose pipeline it is of; leave dataset= out."
            )
        return every_host(it_or_state, wanted, hosts)
    if isinstance(it_or_state, DatasetIterator):
        source = dataset if dataset is not None else it_or_state.iterated
        if source is None:
            raise ValueError(
                f"provenance: the iterator {it_or_state!r} was not made by iter() of a "
                "dataset, so its pipeline is unknown: give it, dataset=ds."
            )
        pipe = _pipeline_of(source)
        found = trace_steps(pipe, wanted, mix_changes=changes_by_mixture(pipe, it_or_state))
        return _named(source, found)
    if dataset is None:
        raise ValueError(
            "provenance: a state holds positions, not the pipeline's functions: give the "
            "pipeline it came from, provenance(state, steps, dataset=ds) (the IterDataset or "
            "DataLoader, built as for the run that saved it)."
        )
    own = getattr(dataset, "_provenance", None)
    if callable(own) and not hasattr(dataset, "_origins"):
        # Not a pipeline but an object that knows its steps (chute.torch.IterableDataset).
        return own(_state_of(it_or_state), wanted)
    pipeline = _pipeline_of(dataset)
    changes = _restored(
        _state_of(it_or_state), dataset if hasattr(dataset, "dataset") else pipeline
    )
    return _named(dataset, trace_steps(pipeline, wanted, mix_changes=changes))


def _checked_by(state: Any, ds: Any) -> tuple[bool, ByMixture | None]:
    """Whether `state` is of `ds`'s pipeline (as `set_state` checks it) and, where it is,
    the weights its mixtures were given at run time."""
    from chute._src.core.errors import CheckpointError

    own = getattr(ds, "_provenance", None)
    try:
        if callable(own) and not hasattr(ds, "_origins"):
            own(_state_of(state), [])  # checks the state, names no step
            return True, None
        return True, _restored(_state_of(state), ds if hasattr(ds, "dataset") else _pipeline_of(ds))
    except CheckpointError:
        return False, None


def every_host(
    it_or_state: Any, wanted: list[int], hosts: Mapping[Any, Any]
) -> list[list[dict[str, Any]]]:
    """`provenance(..., hosts=hosts)`: each step's records on every host."""
    from chute._src.core.errors import CheckpointError

    if not isinstance(hosts, Mapping) or not hosts:
        raise TypeError(
            f"provenance: hosts={hosts!r} is invalid: give a mapping of each host's label to "
            "its pipeline, built with that host's shard options, e.g. "
            "{h: make_data(h, 4) for h in range(4)}."
        )
    state = it_or_state.get_state() if isinstance(it_or_state, DatasetIterator) else it_or_state
    home, changes = None, None
    for label, ds in hosts.items():
        ok, changes = _checked_by(state, ds)
        if ok:
            home = label
            break
    else:
        raise CheckpointError(
            f"provenance: the state is of none of the pipelines of hosts {list(hosts)}: it is "
            "from another pipeline (another seed, sharding or stage); give the hosts' "
            "pipelines built as for the run that saved it."
        )
    if changes is not None and len(hosts) > 1:
        raise ProvenanceError(
            f"provenance: the state (host {home!r}'s) records weights set at run time "
            "(set_weights), which are this host's alone: the other hosts' are not in it; ask "
            "about each host with its own state, provenance(state, steps, dataset=ds)."
        )
    per_host = []
    for label, ds in hosts.items():
        own = getattr(ds, "_provenance", None)
        if callable(own) and not hasattr(ds, "_origins"):
            found = own(_state_of(state), wanted, any_rank=label != home)
        else:
            found = _named(ds, trace_steps(_pipeline_of(ds), wanted, mix_changes=changes))
        per_host.append([[{"host": label, **r} for r in step] for step in found])
    return [[r for host in per_host for r in host[i]] for i in range(len(wanted))]


__all__ = ["ProvenanceError", "provenance"]
