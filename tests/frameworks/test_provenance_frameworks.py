"""Provenance and skip through the frameworks: the `DataLoader` (with worker processes and a
host's shard), Ray workers, and `chute explain` on every host's checkpoint file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
import ray_helpers as rh
from chute.experimental import provenance, skip, skip_state
from chute.sharding import ShardOptions

ROOT = Path(__file__).resolve().parents[2]


class Keep(chute.FilterTransform):
    def filter(self, element: Any) -> bool:
        return int(element["id"]) % 5 != 0


def loader(shard: int = 0, count: int = 1, workers: int = 0, filtered: bool = False) -> Any:
    records = [{"id": i} for i in range(90)]
    sampler = chute.IndexSampler(
        90, shuffle=True, num_epochs=2, seed=4, shard_options=ShardOptions(shard, count)
    )
    ops: list[Any] = [Keep()] if filtered else []
    return chute.DataLoader(
        data_source=records,
        sampler=sampler,
        operations=[*ops, chute.Batch(4)],
        worker_count=workers,
    )


def batches(source: Any) -> list[list[int]]:
    it = iter(source)
    try:
        return [b["id"].tolist() for b in it]
    finally:
        it.close()


def traced(ds: Any, steps: Any) -> list[list[dict[str, Any]]]:
    """`provenance` from a fresh iterator of `ds`, closed after."""
    it = iter(ds)
    try:
        return provenance(it, steps)
    finally:
        it.close()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("filtered", [False, True])
def test_dataloader_steps_name_their_records_and_skip_lands_on_them(
    workers: int, filtered: bool
) -> None:
    ld = loader(1, 2, workers, filtered)
    expected = batches(ld)
    it = iter(ld)
    try:
        found = provenance(it, range(len(expected)))
        assert [[r["index"] for r in step] for step in found] == expected
        assert skip(it, 7) == 7
        assert next(it)["id"].tolist() == expected[7]
        state = it.get_state()
    finally:
        it.close()
    # The state (and the state_dict) of one worker count restores with another; a skipped
    # state of the other host's loader is refused.
    again = iter(loader(1, 2, 2 - workers, filtered))
    try:
        again.set_state(state)
        assert next(again)["id"].tolist() == expected[8]
        moved = skip_state(again.get_state(), 3, dataset=loader(1, 2, 0, filtered))
        assert provenance(moved, [12], dataset=ld) == [found[12]]
    finally:
        again.close()
    with pytest.raises(chute.CheckpointError):
        provenance(state, [0], dataset=loader(0, 2, 0, filtered))


def test_every_hosts_shard_together_is_the_whole_data_once_per_epoch() -> None:
    per_host = [traced(loader(h, 3), range(15)) for h in range(3)]
    seen = sorted(r["index"] for host in per_host for step in host for r in step)
    assert seen == sorted(list(range(90)) * 2)


def test_chute_explain_reads_every_hosts_file(tmp_path: Path) -> None:
    """An Orbax item folder as chute's handler writes it (`process_{i}-of-{n}.json`, the
    format of chute.checkpoint.save), explained for one host and for all."""
    item = tmp_path / "ckpt" / "300" / "data"
    item.mkdir(parents=True)
    for h in range(2):
        it = iter(loader(h, 2))
        next(it)
        chute.checkpoint.save(item / f"process_{h}-of-2.json", it)
        it.close()
    (tmp_path / "hosts_data.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_provenance_frameworks import loader\n\n\n"
        "def pipeline(process_index, process_count):\n"
        "    return loader(process_index, process_count)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), str(tmp_path)]),
    }
    argv = [sys.executable, "-m", "chute.cli", "explain", str(tmp_path / "ckpt" / "300")]
    argv += ["--steps", "2:4", "--pipeline", "hosts_data:pipeline", "--json"]
    out = subprocess.run(
        [*argv, "--all-hosts"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    for h in range(2):
        want = [i for b in batches(loader(h, 2))[2:4] for i in b]
        assert [r["index"] for r in rows if r["host"] == h] == want
    one = subprocess.run(
        [*argv, "--host", "1"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert [r["index"] for r in json.loads(one.stdout)] == [
        r["index"] for r in rows if r["host"] == 1
    ]
    bad = subprocess.run(
        [*argv[:-5], "--steps", "2:4", "--pipeline", "hosts_data:nothing"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert "defines no function 'nothing'" in bad.stderr


@pytest.fixture(scope="module")
def ray() -> Iterator[Any]:
    yield from rh.local_cluster()


def test_ray_workers(ray: Any) -> None:
    import mp_pipelines as mpp

    def build(options: Any) -> chute.IterDataset[Any]:
        ds = chute.MapDataset.range(200).shuffle(seed=2).map(mpp.double).to_iter_dataset()
        return ds.filter(mpp.keep).batch(5).mp_prefetch(options)

    on_ray = build(rh.workers(2))
    expected = [np.asarray(b).tolist() for b in mpp.as_list(build(chute.MultiprocessingOptions()))]
    it = iter(on_ray)
    try:
        found = provenance(it, range(len(expected)))
        assert [[2 * r["index"] for r in step] for step in found] == expected
        skip(it, 6)
        assert next(it).tolist() == expected[6]
    finally:
        it.close()


def odd_record(i: int) -> dict[str, int]:
    return {"id": i}


def not_seventh(x: dict[str, int]) -> bool:
    return x["id"] % 7 != 0


@pytest.mark.parametrize("workers", [0, 2])
def test_the_torch_layer_steps_from_a_copys_state_dict(workers: int) -> None:
    """`chute.torch.IterableDataset` read by torchdata's StatefulDataLoader: the steps of two
    epochs, its workers taking turns, named from one worker copy's state."""
    pytest.importorskip("torch")
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from chute.torch import IterableDataset

    src = chute.MapDataset.range(50).map(odd_record).shuffle(seed=3).filter(not_seventh)
    tds = IterableDataset(src, batch_size=4, shard_options=ShardOptions(1, 2))
    loader = stateful.StatefulDataLoader(tds, batch_size=None, num_workers=workers)
    steps = []
    for epoch in range(2):
        tds.set_epoch(epoch)
        steps += [b["id"].tolist() for b in loader]
    snapshot = loader.state_dict()
    if workers:
        state = snapshot["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"]
    else:
        state = snapshot["dataset_state"]
    found = provenance(state, range(len(steps)), dataset=tds)
    assert [[r["index"] for r in s] for s in found] == steps
    assert {r["epoch"] for s in found[-3:] for r in s} == {1}
    other_rank = IterableDataset(src, batch_size=4, shard_options=ShardOptions(0, 2))
    with pytest.raises(chute.CheckpointError, match="rank 1 of 2"):
        provenance(state, [0], dataset=other_rank)


def not_third(x: int) -> bool:
    return x % 3 != 0


def test_elastic_iterator_hosts_name_their_records_and_the_check_moves_nothing() -> None:
    from chute.experimental import ElasticIterator

    ds = chute.MapDataset.range(40).seed(1).shuffle().filter(not_third).repeat(2)
    seen = []
    for host in range(2):
        expected = [b.tolist() for b in ElasticIterator(ds, 6, ShardOptions(host, 2))]
        elastic = ElasticIterator(ds, 6, ShardOptions(host, 2))
        next(elastic)
        found = provenance(elastic.get_state(), range(len(expected)), dataset=elastic)
        assert [[r["index"] for r in step] for step in found] == expected
        assert provenance(iter(elastic), [1]) == [found[1]]
        assert next(elastic).tolist() == expected[1]  # the state's check left it there
        elastic.close()
        seen += [(r["index"], r["epoch"]) for step in found for r in step]
    # The hosts' shares are disjoint (each host drops its last partial batch).
    assert len(seen) == len(set(seen)) and all(i % 3 for i, _ in seen)


class Backwards:
    """A sampler of the user's: the records from the last to the first."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> chute.RecordMetadata:
        return chute.RecordMetadata(index=index, record_key=self._n - 1 - index)


@pytest.mark.parametrize("kind", ["index", "users"])
def test_a_dataloader_state_saved_by_orbax_names_its_steps_and_skips(
    tmp_path: Path, kind: str
) -> None:
    """A real Orbax checkpoint of a DataLoader read by 2 worker processes, restored into one
    read in this process: provenance from it, then skip (O(1)) and skip_state."""
    ocp = pytest.importorskip("orbax.checkpoint")

    def make(workers: int) -> Any:
        if kind == "users":
            return chute.DataLoader(
                data_source=[{"id": i} for i in range(90)],
                sampler=Backwards(90),
                operations=[chute.Batch(4)],
                worker_count=workers,
            )
        return loader(1, 2, workers)

    expected = batches(make(0))
    it = iter(make(2))
    for _ in range(5):
        next(it)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(5, args=ocp.args.Composite(data=chute.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
        it.close()
        restored = iter(make(0))
        mngr.restore(5, args=ocp.args.Composite(data=chute.checkpoint.CheckpointRestore(restored)))
    try:
        state = restored.get_state()
        found = provenance(state, range(len(expected)), dataset=make(0))
        assert [[r["index"] for r in step] for step in found] == expected
        moved = skip_state(state, 2)
        assert skip(restored, 2) == 2
        assert next(restored)["id"].tolist() == expected[7]
    finally:
        restored.close()
    again = iter(make(2))
    try:
        again.set_state(moved)
        assert next(again)["id"].tolist() == expected[7]
    finally:
        again.close()
