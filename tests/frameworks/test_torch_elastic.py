"""`chute.torch.IterableDataset` with another world size or number of torch workers:
`merge_state_dicts` of all old copies' states, loaded by every new copy (docs/elastic.md).
In one process (ranks as ShardOptions, torch workers as StatefulDataLoader's) and on real
gloo ranks (`tests/frameworks/torch_elastic_worker.py`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
import chute
from process_helpers import wait_all

torch = pytest.importorskip("torch", reason="torch not installed: pip install 'chute[torch]'")
sdl = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata not installed")

import torch_elastic_worker as w  # noqa: E402

import chute.torch as ct  # noqa: E402

WORKER = Path(w.__file__)
merge = ct.IterableDataset.merge_state_dicts


def flat(batches: list[Any]) -> list[int]:
    out: list[int] = []
    for b in batches:
        b = b.tolist() if hasattr(b, "tolist") else b
        out += b if isinstance(b, list) else [b]
    return out


def rank_ds(
    r: int,
    world: int,
    batch_size: int | None = 4,
    drop_remainder: bool = False,
    records: int = w.RECORDS,
) -> ct.IterableDataset:
    base = chute.MapDataset.range(records).shuffle(seed=5).filter(w.keep)
    if drop_remainder:  # without a filter: equal positions are equal counts
        base = chute.MapDataset.range(records).shuffle(seed=5)
    shard = chute.sharding.ShardOptions(r, world, drop_remainder=drop_remainder)
    return ct.IterableDataset(base, batch_size=batch_size, shard_options=shard)


def loader(ds: ct.IterableDataset, workers: int) -> Any:
    return sdl.StatefulDataLoader(ds, batch_size=None, num_workers=workers)


def save_run(world: int, workers: int, steps: list[int], **kw: Any) -> tuple[list[int], list[Any]]:
    """Ranks read `steps[r]` batches; what they delivered and each rank's loader state."""
    seen: list[int] = []
    states = []
    for r in range(world):
        sl = loader(rank_ds(r, world, **kw), workers)
        it = iter(sl)
        seen += flat([next(it) for _ in range(steps[r])])
        states.append(json.loads(json.dumps(sl.state_dict())))
        del it
    return seen, states


def resume_run(merged: dict[str, Any], world: int, workers: int, **kw: Any) -> list[list[int]]:
    out = []
    for r in range(world):
        ds = rank_ds(r, world, **kw)
        ds.load_state_dict(merged)
        out.append(flat(list(loader(ds, workers))))
    return out


@pytest.mark.parametrize(
    "old, new",
    [((2, 2), (3, 0)), ((2, 0), (1, 2)), ((3, 1), (2, 3)), ((1, 2), (1, 1))],
)
def test_every_element_once_over_the_new_ranks_and_workers(
    old: tuple[int, int], new: tuple[int, int]
) -> None:
    seen, states = save_run(*old, steps=[3, 4, 2][: old[0]])
    merged = json.loads(json.dumps(merge(states)))
    rest = resume_run(merged, *new)
    delivered = seen + [x for part in rest for x in part]
    assert sorted(delivered) == w.kept()  # none lost, none repeated
    # the next epoch is a whole new one, cut by the new layout
    nxt = []
    for r in range(new[0]):
        ds = rank_ds(r, new[0])
        ds.set_epoch(1)
        nxt += flat(list(loader(ds, new[1])))
    assert sorted(nxt) == w.kept()


def test_resizing_twice_and_without_batching() -> None:
    seen, states = [], []
    for r in range(2):  # 2 ranks, single elements, no workers
        ds = rank_ds(r, 2, batch_size=None)
        it = iter(ds)
        seen += [int(next(it)) for _ in range(5 + 3 * r)]  # ranks apart: an explicit list
        states.append(ds.state_dict())
    merged = merge(states)
    assert merged["pending"]  # the positions between the slower and the faster rank
    states = []
    for r in range(3):  # 3 ranks read a little (rank 2: nothing), then save again
        ds = rank_ds(r, 3, batch_size=None)
        ds.load_state_dict(merged)
        if r < 2:
            it = iter(ds)
            seen += [int(next(it)) for _ in range(2 + r)]
        states.append(ds.state_dict())  # rank 2's: its share of the merged state
    assert set(states[2]) == set(states[0]) and states[2]["read"] == 0
    for part in resume_run(merge(states), 1, 0, batch_size=None):
        seen += part
    assert sorted(seen) == w.kept()


@settings(max_examples=60, deadline=None)
@given(
    worlds=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    reads=st.lists(st.integers(0, 12), min_size=16, max_size=16),
    batch_size=st.sampled_from([None, 1, 3]),
    records=st.integers(1, 40),
)
def test_any_chain_of_world_sizes_delivers_each_element_once(
    worlds: list[int], reads: list[int], batch_size: int | None, records: int
) -> None:
    """Ranks (in one process) read some batches, save, and the next world size resumes
    from the merged states, several times over; the last reads to the end."""
    seen: list[int] = []
    merged: dict[str, Any] | None = None
    for step, world in enumerate(worlds):
        states = []
        for r in range(world):
            ds = rank_ds(r, world, batch_size=batch_size, records=records)
            if merged is not None:
                ds.load_state_dict(merged)
            it = iter(ds)
            last = step == len(worlds) - 1
            n = 0 if ds.epoch > 0 else 10**6 if last else reads[(step * 4 + r) % 16]
            for _ in range(n):  # nothing once epoch 0 was read to its end
                try:
                    seen += flat([next(it)])
                except StopIteration:
                    break
            states.append(ds.state_dict())
        merged = json.loads(json.dumps(merge(states)))
    assert sorted(seen) == [x for x in range(records) if w.keep(x)]


def test_a_copy_that_finished_the_epoch_contributes_nothing() -> None:
    seen, states = [], []
    for r in range(2):
        ds = rank_ds(r, 2)
        it = iter(ds)
        if r == 0:
            seen += flat(list(it))  # rank 0 read its part to the end: it is at epoch 1
            assert ds.epoch == 1
        else:
            seen += flat([next(it)])
        states.append(ds.state_dict())
    merged = merge(states)
    assert merged["epoch"] == 0
    for part in resume_run(merged, 3, 0):
        seen += part
    assert sorted(seen) == w.kept()


def test_states_at_an_epoch_boundary_merge_to_the_next_epoch() -> None:
    states = []
    for r in range(2):
        ds = rank_ds(r, 2)
        list(ds)
        states.append(ds.state_dict())
    merged = merge(states)
    assert merged["epoch"] == 1  # all of epoch 1 is left
    assert merged["pending"] + list(range(merged["next_index"], merged["stop"])) == list(
        range(w.RECORDS)
    )
    assert sorted(x for part in resume_run(merged, 3, 0) for x in part) == w.kept()


def test_an_unchanged_layout_continues_each_worker_exactly() -> None:
    # own loader states (StatefulDataLoader.load_state_dict): batch for batch
    sl = loader(rank_ds(0, 1), 2)
    it = iter(sl)
    first = flat([next(it) for _ in range(3)])
    state = json.loads(json.dumps(sl.state_dict()))
    rest = [b.tolist() for b in it]
    again = loader(rank_ds(0, 1), 2)
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == rest
    # the merged state: each worker continues its own stream (torch's round robin over the
    # workers starts again at worker 0)
    ds = rank_ds(0, 1)
    ds.load_state_dict(merge([state]))
    merged_rest = [b.tolist() for b in loader(ds, 2)]
    for k in range(2):
        mine = {x for x in ds.part(0, k, 2) if x is not None}
        assert [b for b in merged_rest if b[0] in mine] == [b for b in rest if b[0] in mine]
    assert merged_rest != rest  # here the old run's next batch was worker 1's
    assert sorted(first + flat(merged_rest)) == w.kept()


def test_drop_remainder_gives_the_new_ranks_equal_counts() -> None:
    kw: dict[str, Any] = {"batch_size": None, "drop_remainder": True, "records": 91}
    seen, states = save_run(2, 0, steps=[3, 3], **kw)
    merged = merge(states)
    rest = resume_run(merged, 3, 0, **kw)
    assert [len(p) for p in rest] == [28, 28, 28]  # every rank the same count, for DDP
    delivered = seen + [x for p in rest for x in p]
    assert len(delivered) == len(set(delivered))
    # lost: 1 by the old run's rule (91 % 2) and (90 - 6) % 3 = 0 by the new one's
    assert len(delivered) == 90


def test_merge_names_missing_repeated_and_foreign_states() -> None:
    _, states = save_run(2, 2, steps=[2, 2])
    with pytest.raises(chute.CheckpointError, match=r"missing copies \[1, 3\], repeated \[\]"):
        merge(states[:1])
    with pytest.raises(chute.CheckpointError, match=r"missing copies \[1, 3\], repeated \[0, 2\]"):
        merge([states[0], states[0]])
    with pytest.raises(ValueError, match=r"pass a non-empty list"):
        merge([])
    with pytest.raises(chute.CheckpointError, match=r"neither a chute.torch.IterableDataset state"):
        merge([{"model": 1}])
    merged = merge(states)
    with pytest.raises(chute.CheckpointError, match=r"it is a merged state.*load it into every"):
        merge([merged])
    other = ct.IterableDataset(chute.MapDataset.range(w.RECORDS).shuffle(seed=6), batch_size=4)
    with pytest.raises(chute.CheckpointError, match=r"is not this dataset's"):
        other.load_state_dict(merged)
    one = ct.IterableDataset(chute.MapDataset.range(w.RECORDS).shuffle(seed=6))
    list(iter(one))
    with pytest.raises(chute.CheckpointError, match=r"\['pipeline'\] = .* differs from the first"):
        merge([*states, one.state_dict()])


def test_an_edited_merged_state_is_rejected() -> None:
    _, states = save_run(2, 0, steps=[2, 3])
    merged = merge(states)
    ds = rank_ds(0, 3)
    with pytest.raises(chute.CheckpointError, match=r"was changed after it was saved"):
        ds.load_state_dict({**merged, "next_index": merged["next_index"] + 1})
    unsealed = {k: v for k, v in merged.items() if k != "checksum"}
    with pytest.raises(chute.CheckpointError, match=r"\['pending'\] = .* increasing ints"):
        ds.load_state_dict({**unsealed, "pending": [5, 3]})
    edited = json.loads(json.dumps(states[1]))
    edited["dataset_state"]["read"] += 1
    with pytest.raises(chute.CheckpointError, match=r"was changed after it was saved"):
        merge([states[0], edited])


def test_a_loader_state_taken_between_snapshots_is_refused() -> None:
    sl = sdl.StatefulDataLoader(
        rank_ds(0, 1), batch_size=None, num_workers=2, snapshot_every_n_steps=4
    )
    it = iter(sl)
    for _ in range(3):
        next(it)
    with pytest.raises(chute.CheckpointError, match=r"snapshot_every_n_steps=1"):
        merge([sl.state_dict()])
    del it


# -- real gloo ranks ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(phase: str, world: int, workers: int, tmp_path: Path) -> list[dict[str, Any]]:
    port = _free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "OMP_NUM_THREADS": "1",
    }
    outs = [tmp_path / f"{phase}{r}.json" for r in range(world)]
    procs = []
    for r in range(world):
        cfg = {
            "phase": phase,
            "rank": r,
            "world": world,
            "port": port,
            "workers": workers,
            "dir": str(tmp_path),
            "out": str(outs[r]),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), json.dumps(cfg)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        )
    wait_all(procs, timeout=180)
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.parametrize("old, new", [((2, 0), (1, 2)), ((2, 2), (3, 1)), ((2, 2), (2, 2))])
def test_gloo_ranks_resume_with_another_world_size(
    old: tuple[int, int], new: tuple[int, int], tmp_path: Path
) -> None:
    saved = _run_ranks("save", *old, tmp_path)
    resumed = _run_ranks("resume", *new, tmp_path)
    before = [x for r in saved for b in r["before"] for x in b]
    after = [x for r in resumed for b in r["after"] for x in b]
    assert sorted(before + after) == w.kept()  # every element of the epoch exactly once
    assert sorted(x for r in resumed for b in r["next"] for x in b) == w.kept()
    if old == new:  # an unchanged world size continues identically, batch for batch
        assert [r["after"] for r in resumed] == [r["after"] for r in saved]
