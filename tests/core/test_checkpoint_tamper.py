"""A state carries a checksum of its values, so a state edited after it was saved is
rejected wherever it is restored: `set_state`, `load_state_dict`, `chute.checkpoint.load`,
the Orbax handler, the elastic restore with another host count, chute.torch. States
without a checksum (older ones, or one whose checksum a user deleted on purpose) restore
unchecked.

The edits are single counters moved by one: values that pass every range check (they
did before states carried a checksum) and give another stream.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute.experimental import (
    BestFitPackIterDataset,
    ConcatThenSplitIterDataset,
    ElasticIterator,
    FirstFitPackIterDataset,
)
from chute.testing import assert_equal_output_after_checkpoint

CHANGED = "changed after it was saved"


def _source() -> chute.IterDataset[Any]:
    seqs = [{"t": np.arange(1, n + 1)} for n in [4, 6, 2, 3, 1, 5, 2, 7, 1, 3] * 5]
    return chute.MapDataset.source(seqs).to_iter_dataset()


PIPELINES: dict[str, Callable[[], chute.IterDataset[Any]]] = {
    "first_fit": lambda: FirstFitPackIterDataset(
        _source(), length_struct={"t": 8}, num_packing_bins=3
    ),
    "best_fit": lambda: BestFitPackIterDataset(
        _source(), length_struct={"t": 8}, num_packing_bins=3
    ),
    "concat_then_split": lambda: ConcatThenSplitIterDataset(_source(), length_struct={"t": 8}),
    "mix": lambda: chute.IterDataset.mix(
        [
            chute.MapDataset.range(100).to_iter_dataset(),
            chute.MapDataset.range(100, 200).to_iter_dataset(),
        ],
        [0.3, 0.7],
    ),
}
STEP = 5

# (pipeline, path of the counter, change): each one restored without a checksum before,
# and gave another stream.
EDITS = [
    ("first_fit", ("skip",), 1),
    ("first_fit", ("emitted",), -1),
    ("first_fit", ("counter",), 1),
    ("first_fit", ("counter",), -1),
    ("first_fit", ("parent", "next_index"), 1),
    ("first_fit", ("parent", "next_index"), -1),
    ("best_fit", ("emitted",), -1),
    ("best_fit", ("counter",), 1),
    ("concat_then_split", ("skip",), 1),
    ("concat_then_split", ("emitted",), -1),
    ("concat_then_split", ("parent", "next_index"), 1),
    ("mix", ("index",), -1),
    ("mix", ("parents", 0, "next_index"), 1),
    ("mix", ("parents", 1, "next_index"), 1),
]


def plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    return x.tolist() if isinstance(x, np.ndarray) else x


def rest(it: Any) -> list[Any]:
    return [plain(x) for x in it]


def edited(state: dict[str, Any], path: tuple[Any, ...], change: int) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    node: Any = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] += change
    return out


def started(name: str) -> Any:
    it = iter(PIPELINES[name]())
    for _ in range(STEP):
        next(it)
    return it


@pytest.mark.parametrize(("name", "path", "change"), EDITS)
def test_set_state_rejects_a_counter_moved_by_one(
    name: str, path: tuple[Any, ...], change: int
) -> None:
    state = started(name).get_state()
    bad = edited(state, path, change)
    it = started(name)
    expected = rest(started(name))
    with pytest.raises(chute.CheckpointError, match=f"state was {CHANGED}"):
        it.set_state(bad)
    assert rest(it) == expected  # the rejected state left the iterator where it was
    # Deleting the checksum restores the edit unchecked (docs/checkpointing.md): the
    # values are plausible, and the stream is another one.
    unchecked = iter(PIPELINES[name]())
    unchecked.set_state({k: v for k, v in bad.items() if k != "checksum"})
    assert rest(unchecked) != expected


@pytest.mark.parametrize(("name", "path", "change"), EDITS)
def test_load_state_dict_rejects_a_counter_moved_by_one(
    name: str, path: tuple[Any, ...], change: int
) -> None:
    sd = started(name).state_dict()
    text = json.dumps(edited(json.loads(sd["chute_state"]), path, change))
    with pytest.raises(chute.CheckpointError, match=rf"state_dict\['chute_state'\].*{CHANGED}"):
        iter(PIPELINES[name]()).load_state_dict({"chute_state": text})
    with pytest.raises(chute.CheckpointError, match=CHANGED):  # bytes, as torch may keep it
        iter(PIPELINES[name]()).load_state_dict({"chute_state": text.encode()})


@pytest.mark.parametrize(("name", "path", "change"), EDITS[::3])
def test_checkpoint_load_rejects_an_edited_file(
    tmp_path: Path, name: str, path: tuple[Any, ...], change: int
) -> None:
    file = tmp_path / "data.json"
    chute.checkpoint.save(file, started(name))
    doc = json.loads(file.read_text())
    doc["state"] = edited(doc["state"], path, change)
    file.write_text(json.dumps(doc))
    with pytest.raises(chute.CheckpointError, match=f"data.json'.*{CHANGED}"):
        chute.checkpoint.load(file, iter(PIPELINES[name]()))


def test_the_orbax_handler_rejects_an_edited_file(tmp_path: Path) -> None:
    handler = chute.checkpoint.CheckpointHandler()
    handler.save(tmp_path, item=started("first_fit"))
    (file,) = tmp_path.glob("process_*-of-*.json")
    doc = json.loads(file.read_text())
    doc["state"] = edited(doc["state"], ("counter",), 1)
    file.write_text(json.dumps(doc))
    with pytest.raises(chute.CheckpointError, match=f"{file.name}'.*{CHANGED}"):
        handler.restore(tmp_path, item=iter(PIPELINES["first_fit"]()))


def _elastic(j: int, m: int) -> Any:
    ds = chute.MapDataset.range(60).shuffle(seed=3).filter(lambda x: x % 4 != 1)
    return iter(ElasticIterator(ds, 6, chute.sharding.ShardOptions(j, m)))


def test_the_elastic_restore_rejects_an_edited_host_file(tmp_path: Path) -> None:
    states = []
    for j in range(2):
        it = _elastic(j, 2)
        next(it)
        next(it)
        states.append(it.get_state())
        chute.checkpoint.save(tmp_path / f"process_{j}-of-2.json", it)
    # Unedited, another host count restores the merge.
    restored = chute.checkpoint.CheckpointHandler().restore(tmp_path, item=_elastic(0, 1))
    assert len(rest(restored)) > 0
    with pytest.raises(chute.CheckpointError, match=rf"states\[1\] was {CHANGED}"):
        ElasticIterator.merge_states([states[0], edited(states[1], ("next_index",), 2)])
    merged = ElasticIterator.merge_states(states)
    assert len(merged["checksum"]) == 16  # a merged state is sealed too
    with pytest.raises(chute.CheckpointError, match=CHANGED):
        _elastic(0, 3).set_state(edited(merged, ("next_index",), 1))
    file = tmp_path / "process_1-of-2.json"
    doc = json.loads(file.read_text())
    doc["state"] = edited(doc["state"], ("next_index",), 2)
    file.write_text(json.dumps(doc))
    with pytest.raises(chute.CheckpointError, match=f"process_1-of-2.json'.*{CHANGED}"):
        chute.checkpoint.CheckpointHandler().restore(tmp_path, item=_elastic(0, 1))


def test_a_data_loader_state_is_sealed_and_checked() -> None:
    def loader() -> chute.DataLoader:
        return chute.DataLoader(
            data_source=list(range(40)),
            sampler=chute.IndexSampler(40, shuffle=True, seed=4, num_epochs=1),
            operations=[chute.Batch(4)],
        )

    it = iter(loader())
    next(it)
    state = it.get_state()
    assert len(state["checksum"]) == 16
    again = iter(loader())
    again.set_state(state)
    assert again.get_state() == state
    with pytest.raises(chute.CheckpointError, match=CHANGED):
        iter(loader()).set_state(edited(state, ("next_index",), 1))


def test_chute_torch_rejects_an_edited_epoch_or_position() -> None:
    ct = pytest.importorskip("chute.torch")
    ds = ct.IterableDataset(chute.MapDataset.range(30).shuffle(seed=2), batch_size=4)
    batches = iter(ds)
    next(batches)
    sd = json.loads(json.dumps(ds.state_dict()))
    fresh = ct.IterableDataset(chute.MapDataset.range(30).shuffle(seed=2), batch_size=4)
    fresh.load_state_dict(sd)
    assert fresh.state_dict() == sd
    with pytest.raises(chute.CheckpointError, match=rf"state_dict was {CHANGED}"):
        fresh.load_state_dict({**sd, "epoch": sd["epoch"] + 1})
    inner = json.loads(sd["iterator"]["chute_state"])
    moved = json.dumps(edited(inner, ("parent", "next_index"), 1))
    unsealed = {k: v for k, v in sd.items() if k != "checksum"}
    with pytest.raises(chute.CheckpointError, match=CHANGED):  # the iterator's own checksum
        fresh.load_state_dict({**unsealed, "iterator": {"chute_state": moved}})


def test_stateful_dataloader_state_is_checked() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    class ChuteIterable(torch.utils.data.IterableDataset[Any]):
        def __iter__(self) -> Any:
            return iter(PIPELINES["mix"]())

    loader = StatefulDataLoader(ChuteIterable(), batch_size=None)
    batches = iter(loader)
    for _ in range(STEP):
        next(batches)
    state = loader.state_dict()
    expected = [int(x) for x in batches]

    def with_chute_state(sd: Any, change: Callable[[str], str]) -> Any:
        if isinstance(sd, dict):
            return {
                k: change(v) if k == "chute_state" else with_chute_state(v, change)
                for k, v in sd.items()
            }
        return sd

    def move(text: str) -> str:
        return json.dumps(edited(json.loads(text), ("index",), -1))

    good = StatefulDataLoader(ChuteIterable(), batch_size=None)
    good.load_state_dict(state)
    assert [int(x) for x in good] == expected
    bad = StatefulDataLoader(ChuteIterable(), batch_size=None)
    bad.load_state_dict(with_chute_state(state, move))
    with pytest.raises(chute.CheckpointError, match=CHANGED):
        next(iter(bad))


# -- what the checksum is, and states without one ----------------------------------------------


def test_the_checksum_is_16_hex_of_sha256_of_the_canonical_json() -> None:
    state = started("mix").get_state()
    values = {k: v for k, v in state.items() if k != "checksum"}
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"))
    assert state["checksum"] == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    assert json.loads(json.dumps(state)) == state  # still plain, small JSON
    assert len(json.dumps(state)) < 400


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_get_state_after_set_state_is_the_same_state(name: str) -> None:
    state = started(name).get_state()
    it = iter(PIPELINES[name]())
    it.set_state(json.loads(json.dumps(state)))
    assert it.get_state() == state
    assert_equal_output_after_checkpoint(PIPELINES[name](), max_elements=30)


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_state_saved_without_a_checksum_still_restores(tmp_path: Path, name: str) -> None:
    """States saved before states carried a checksum restore as they always did."""
    it = started(name)
    old = {k: v for k, v in it.get_state().items() if k != "checksum"}
    expected = rest(it)
    fresh = iter(PIPELINES[name]())
    fresh.set_state(old)
    assert rest(fresh) == expected
    file = tmp_path / "old.json"
    file.write_text(json.dumps({"format": "chute.iterator_state", "version": 1, "state": old}))
    assert rest(chute.checkpoint.load(file, iter(PIPELINES[name]()))) == expected
    fresh = iter(PIPELINES[name]())
    fresh.load_state_dict({"chute_state": json.dumps(old)})
    assert rest(fresh) == expected


def test_a_checksum_that_is_not_a_string_is_rejected() -> None:
    state = started("mix").get_state()
    with pytest.raises(chute.CheckpointError, match=CHANGED):
        iter(PIPELINES["mix"]()).set_state({**state, "checksum": None})
