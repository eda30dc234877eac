"""`skip` and `skip_state` with the torch layer: `chute.torch.IterableDataset` read directly
and by torch's and torchdata's `DataLoader` with 0 and 2 worker processes, from a live
iterator and from a saved `state_dict`; and `provenance` from a `StatefulDataLoader`'s
state."""

from __future__ import annotations

from typing import Any

import pytest

import chute
from chute.experimental import ProvenanceError, provenance, skip, skip_state
from chute.sharding import ShardOptions

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
from chute.torch import IterableDataset  # noqa: E402

CALLS: list[int] = []  # the elements `counted` computed in this process


def counted(x: int) -> int:
    CALLS.append(x)
    return x


def not_seventh(x: int) -> bool:
    return x % 7 != 0


def records(seed: int = 3, filtered: bool = False) -> chute.MapDataset[Any]:
    ds = chute.MapDataset.range(90).shuffle(seed=seed).map(counted)
    return ds.filter(not_seventh) if filtered else ds


def dataset(seed: int = 3, filtered: bool = False, rank: int = 0, ranks: int = 1) -> Any:
    return IterableDataset(
        records(seed, filtered), batch_size=4, shard_options=ShardOptions(rank, ranks)
    )


def loader(ds: Any, workers: int) -> Any:
    return stateful.StatefulDataLoader(ds, batch_size=None, num_workers=workers)


def read(source: Any, count: int | None = None) -> list[list[int]]:
    it = iter(source)
    out = []
    for b in it:
        out.append(b.tolist())
        if count is not None and len(out) == count:
            break
    return out


def state_after(workers: int, filtered: bool, steps: int) -> dict[str, Any]:
    """The state of a StatefulDataLoader that has handed out `steps` batches."""
    ld = loader(dataset(filtered=filtered), workers)
    it = iter(ld)
    for _ in range(steps):
        next(it)
    state: dict[str, Any] = ld.state_dict()
    # The rest of the epoch, read to its end: with 0 workers the pipeline runs in this
    # process, and a reader left mid-stream could still be computing ahead on its threads
    # (counted in CALLS) while a test measures what skip_state computes.
    for _ in it:
        pass
    del it
    return state


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("filtered", [False, True])
def test_skip_state_of_a_stateful_dataloader_lands_on_step_n(workers: int, filtered: bool) -> None:
    full = read(loader(dataset(filtered=filtered), workers))
    for start, n in [(0, 5), (3, 4), (1, 2), (4, 1), (2, 0)]:
        moved = skip_state(
            state_after(workers, filtered, start), n, dataset=dataset(filtered=filtered)
        )
        ld = loader(dataset(filtered=filtered), workers)
        ld.load_state_dict(moved)
        it = iter(ld)
        assert next(it).tolist() == full[start + n], (start, n)
        # The state it then saves restores as any state does.
        again = ld.state_dict()
        del it
        resumed = loader(dataset(filtered=filtered), workers)
        resumed.load_state_dict(again)
        assert read(resumed) == full[start + n + 1 :], (start, n)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_skip_past_the_epochs_end_stops_there(workers: int) -> None:
    full = read(loader(dataset(), workers))
    moved = skip_state(state_after(workers, False, 2), len(full) + 10, dataset=dataset())
    ld = loader(dataset(), workers)
    ld.load_state_dict(moved)
    assert read(ld) == []


def test_a_skipped_state_restores_with_another_worker_count_through_the_merge() -> None:
    """With 2 workers, skipped, then merged and read with 0: the records not skipped, each
    once."""
    full = read(loader(dataset(), 2))
    moved = skip_state(state_after(2, False, 3), 6, dataset=dataset())
    single = dataset()
    single.load_state_dict(IterableDataset.merge_state_dicts([moved]))
    rest = read(loader(single, 0))
    assert sorted(i for b in rest for i in b) == sorted(i for b in full[9:] for i in b)


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_state_runs_no_map_where_positions_are_index_arithmetic(workers: int) -> None:
    state = state_after(workers, False, 2)
    CALLS.clear()
    moved = skip_state(state, 15, dataset=dataset())
    assert CALLS == []  # no element was computed here
    ld = loader(dataset(), workers)
    ld.load_state_dict(moved)
    assert read(ld, 1) == [read(loader(dataset(), workers))[17]]


@pytest.mark.parametrize("filtered", [False, True])
def test_skip_of_the_datasets_own_iterator_and_of_its_state_dict(filtered: bool) -> None:
    """Read without a DataLoader (or with num_workers=0): one copy, whose state_dict
    skip_state moves too."""
    full = read(dataset(filtered=filtered))
    ds = dataset(filtered=filtered)
    it = iter(ds)
    next(it)
    CALLS.clear()
    assert skip(it, 6) == 6
    if not filtered:
        assert CALLS == []  # O(1): nothing was read
    assert next(it).tolist() == full[7]
    resumed = dataset(filtered=filtered)
    resumed.load_state_dict(ds.state_dict())
    assert read(resumed) == full[8:]
    moved = skip_state(ds.state_dict(), 3, dataset=dataset(filtered=filtered))
    again = dataset(filtered=filtered)
    again.load_state_dict(moved)
    assert read(again) == full[11:]
    assert skip(it, 100) == len(full) - 8  # as far as the epoch goes
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_of_a_live_torch_dataloader_reads_the_steps(workers: int) -> None:
    """A torch DataLoader's workers are already at work: skip reads and drops; the
    StatefulDataLoader's state then restores to the step after."""
    full = read(loader(dataset(filtered=True), workers))
    plain = torch.utils.data.DataLoader(
        dataset(filtered=True), batch_size=None, num_workers=workers
    )
    it = iter(plain)
    assert skip(it, 5) == 5
    assert next(it).tolist() == full[5]
    del it
    ld = loader(dataset(filtered=True), workers)
    it = iter(ld)
    assert skip(it, 4) == 4
    state = ld.state_dict()
    assert next(it).tolist() == full[4]
    del it
    resumed = loader(dataset(filtered=True), workers)
    resumed.load_state_dict(state)
    assert read(resumed) == full[4:]


@pytest.mark.parametrize("workers", [0, 2])
def test_provenance_from_a_stateful_dataloaders_state(workers: int) -> None:
    full = read(loader(dataset(filtered=True), workers))
    state = state_after(workers, True, 3)
    found = provenance(state, range(len(full)), dataset=dataset(filtered=True))
    assert [[r["index"] for r in step] for step in found] == full
    moved = skip_state(state, 2, dataset=dataset(filtered=True))
    assert provenance(moved, [5], dataset=dataset(filtered=True)) == [found[5]]


def test_bad_input_names_the_rule_and_the_fix() -> None:
    state = state_after(2, False, 3)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"n=.* is invalid: the number of steps to skip"):
            skip_state(state, bad, dataset=dataset())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"n=.* is invalid"):
            skip(iter(dataset()), bad)  # type: ignore[arg-type]
    with pytest.raises(chute.CheckpointError, match=r"not this dataset's"):
        skip_state(state, 2, dataset=dataset(seed=4))  # a state of another pipeline
    with pytest.raises(chute.CheckpointError, match=r"rank 0 of 1.*rank 1 of 2"):
        skip_state(state, 2, dataset=dataset(rank=1, ranks=2))
    worker_1 = state["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"]
    with pytest.raises(ValueError, match=r"torch worker 1 of 2.*StatefulDataLoader's state_dict"):
        skip_state(worker_1, 2, dataset=dataset())
    merged = IterableDataset.merge_state_dicts([state])
    with pytest.raises(chute.CheckpointError, match=r"merge_state_dicts returned"):
        skip_state(merged, 2, dataset=dataset())
    with pytest.raises(chute.CheckpointError, match=r"not a state of chute.torch"):
        skip_state({"epoch": 0}, 2, dataset=dataset())
    with pytest.raises(TypeError, match=r"is not an iterator"):
        skip(dataset(), 2)
    live = iter(torch.utils.data.DataLoader(dataset(), batch_size=None))
    with pytest.raises(TypeError, match=r"not the iterator of a chute pipeline.*state_dict"):
        provenance(live, [0], dataset=dataset())


class Reversed(chute.MapDataset[int]):
    """A stage of the user's that does not say where its elements come from."""

    def __init__(self, parent: chute.MapDataset[int]) -> None:
        super().__init__([parent])
        self._parent = parent

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index: int) -> int:  # type: ignore[override]
        return int(self._parent[len(self) - 1 - index])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_user_stage_without_origins_is_named_and_skip_still_lands(workers: int) -> None:
    def users() -> Any:
        return IterableDataset(Reversed(chute.MapDataset.range(30).shuffle(seed=1)), batch_size=4)

    full = read(loader(users(), workers))
    ld = loader(users(), workers)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    del it
    with pytest.raises(ProvenanceError, match=r"Reversed.*declare `_origins\(self, position"):
        provenance(state, [0], dataset=users())
    moved = skip_state(state, 3, dataset=users())  # the batches are read to be counted
    resumed = loader(users(), workers)
    resumed.load_state_dict(moved)
    assert read(resumed) == full[4:]


def test_skip_state_in_a_later_epoch() -> None:
    """The copies' states say their epoch: the move stays in it (a new shuffle)."""
    ds = dataset(filtered=True)
    ds.set_epoch(1)
    second = read(loader(ds, 2))
    assert second != read(loader(dataset(filtered=True), 2))
    ds = dataset(filtered=True)
    ds.set_epoch(1)
    ld = loader(ds, 2)
    it = iter(ld)
    next(it), next(it)
    moved = skip_state(ld.state_dict(), 3, dataset=dataset(filtered=True))
    del it
    resumed = loader(dataset(filtered=True), 2)
    resumed.load_state_dict(moved)
    assert read(resumed) == second[5:]
