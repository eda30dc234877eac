"""`chute.experimental.ElasticIterator`: resuming with another host count (docs/elastic.md).

The resize tests run every host as its own process (`tests/frameworks/elastic_host.py`), which saves
its state as JSON to a shared directory, as `process_{i}-of-{n}.json`; the next run's
hosts read them.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import chute
from chute.experimental import ElasticIterator
from chute.testing import assert_equal_output_after_checkpoint

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import elastic_host  # noqa: E402

from process_helpers import wait_all  # noqa: E402

N = elastic_host.N
HOST_BATCH = 3
STEPS_BEFORE = 3  # mid-epoch 0


def run_hosts(
    pipeline: str, m: int, steps: int, states_in: Path, out_dir: Path, restore: str | None
) -> list[list[list[int]]]:
    """Runs hosts 0..m-1 as processes at once; returns what each delivered, step by step."""
    procs = []
    for j in range(m):
        cfg = {
            "pipeline": pipeline,
            "shard_index": j,
            "shard_count": m,
            "host_batch": HOST_BATCH,
            "steps": steps,
            "states_in": str(states_in),
            "out_dir": str(out_dir),
            "restore": restore,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "elastic_host.py"), json.dumps(cfg)],
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    wait_all(procs)
    return [json.loads((out_dir / f"out_{j}.json").read_text()) for j in range(m)]


def states(d: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("process_*-of-*.json"))]


@pytest.mark.parametrize(
    ("pipeline", "before", "after", "restore"),
    [
        ("filter", 2, 1, "merge"),
        ("filter", 2, 3, "merge"),
        ("filter", 4, 2, "merge"),
        ("plain", 4, 2, "host0"),  # Grain's way: one host's state for all, without filter
    ],
)
def test_a_changed_host_count_delivers_every_element_once_per_epoch(
    tmp_path: Path, pipeline: str, before: int, after: int, restore: str
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    out1 = run_hosts(pipeline, before, STEPS_BEFORE, tmp_path, first, None)
    steps = 3 * N // (HOST_BATCH * after)  # about three epochs after the change
    out2 = run_hosts(pipeline, after, steps, first, second, restore)
    delivered = collections.Counter(v for host in out1 + out2 for batch in host for v in batch)
    repeated = {v: c for v, c in delivered.items() if c > 1}
    assert not repeated, repeated
    # Every index below the slowest host's next one has been read by someone.
    left = ElasticIterator.merge_states(states(second))
    read_below = min([*left["pending"], left["next_index"]])
    complete_epochs = read_below // N
    assert complete_epochs >= 2
    keep = elastic_host.kept if pipeline == "filter" else (lambda v: True)
    for e in range(complete_epochs):
        wanted = {v for v in range(e * N, (e + 1) * N) if keep(v)}
        got = {v for v in delivered if e * N <= v < (e + 1) * N}
        assert got == wanted, (e, sorted(wanted - got), sorted(got - wanted))
    # The states stay small: a host's explicit list holds what lies between the hosts.
    for s in states(first) + states(second):
        assert len(s["pending"]) <= N // 2


def test_the_same_host_count_continues_bit_identically(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    out1 = run_hosts("filter", 2, STEPS_BEFORE, tmp_path, first, None)
    out2 = run_hosts("filter", 2, 20, first, second, "own")
    for j in range(2):
        cfg = {"pipeline": "filter", "shard_index": j, "shard_count": 2, "host_batch": 3}
        it = elastic_host.make(cfg)
        assert out1[j] + out2[j] == [next(it).tolist() for _ in range(STEPS_BEFORE + 20)]


class Fresh:
    """An iterable giving a fresh ElasticIterator each time."""

    def __init__(self, ds: chute.MapDataset[Any], gbs: int, shard: Any, **kw: Any) -> None:
        self.args, self.kw = (ds, gbs, shard), kw

    def __iter__(self) -> Any:
        return iter(ElasticIterator(*self.args, **self.kw))


def test_restores_at_every_step_with_workers_or_without() -> None:
    ds = chute.MapDataset.range(60).shuffle(seed=3).filter(lambda x: x % 4)
    shard = chute.sharding.ShardOptions(1, 2)
    assert_equal_output_after_checkpoint(Fresh(ds, 4, shard))
    workers = chute.MultiprocessingOptions(num_workers=2)
    assert_equal_output_after_checkpoint(
        Fresh(ds, 4, shard),
        restore_into=Fresh(ds, 4, shard, multiprocessing_options=workers),
        steps=[0, 3, 7],
    )


def test_grain_semantics_without_filter() -> None:
    ds = chute.MapDataset.range(10).map(lambda x: x + 1)
    shard = chute.sharding.ShardOptions(shard_index=2, shard_count=4)
    assert [b.tolist() for b in ElasticIterator(ds, 8, shard)] == [[3, 7]]
    it = ElasticIterator(ds, 2, chute.sharding.ShardOptions(shard_index=0, shard_count=2))
    assert [b.tolist() for b in it] == [[1], [3], [5], [7], [9]]


def test_bad_arguments_name_the_rule_and_the_fix() -> None:
    ds = chute.MapDataset.range(10)
    shard = chute.sharding.ShardOptions(0, 4)
    with pytest.raises(ValueError, match=r"global_batch_size=6 .* multiple of shard_count=4"):
        ElasticIterator(ds, 6, shard)
    with pytest.raises(TypeError, match=r"needs a MapDataset.*before to_iter_dataset"):
        ElasticIterator(ds.to_iter_dataset(), 4, shard)  # type: ignore[arg-type]


def test_bad_states_name_the_rule_and_the_fix() -> None:
    ds = chute.MapDataset.range(40).filter(lambda x: x % 3)

    def host(j: int, m: int) -> ElasticIterator:
        return ElasticIterator(ds, 2 * m, chute.sharding.ShardOptions(j, m))

    olds = [host(j, 2) for j in range(2)]
    for it in olds:
        next(it)
    saved = [it.get_state() for it in olds]
    with pytest.raises(chute.CheckpointError, match=r"missing \[1\].*all 2 states"):
        ElasticIterator.merge_states(saved[:1])
    with pytest.raises(chute.CheckpointError, match=r"has a filter.*merge_states"):
        host(0, 3).set_state(saved[0])
    with pytest.raises(chute.CheckpointError, match="host 0 of 2's state was given to host 1"):
        host(1, 2).set_state(saved[0])
    other = ElasticIterator(chute.MapDataset.range(41), 4, chute.sharding.ShardOptions(0, 2))
    with pytest.raises(chute.CheckpointError, match="same dataset"):
        other.set_state(saved[0])
    next(olds[0])
    with pytest.raises(chute.CheckpointError, match=r"\['step'\] = 1 differs from states\[0\]'s 2"):
        ElasticIterator.merge_states([olds[0].get_state(), saved[1]])


DOC = HERE.parents[1] / "docs" / "elastic.md"


def test_the_example_of_elastic_md_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"__name__": "elastic_md"})


def test_a_corrupt_state_is_rejected_and_leaves_the_iterator_as_it_was() -> None:
    it = ElasticIterator(chute.MapDataset.range(20), 2, chute.sharding.ShardOptions(0, 1))
    next(it)
    state = it.get_state()
    del state["checksum"]  # the values themselves are checked (with it, any edit is rejected)
    with pytest.raises(chute.CheckpointError, match=r"\['layout'\] = 'x'.*corrupt"):
        it.set_state({**state, "layout": "x"})
    with pytest.raises(chute.CheckpointError, match=r"\['pending'\] must be a list"):
        it.set_state({**state, "pending": [-1]})
    assert next(it).tolist() == [2, 3]
