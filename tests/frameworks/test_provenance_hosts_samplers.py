"""`provenance(..., hosts=...)`: every host's records of a step, from one host's state (the
DataLoader's shard options, the torch layer's ranks, two real JAX processes); and
provenance and skip through the DataLoader with each kind of sampler (IndexSampler,
SequentialSampler, a sampler of the user's)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute.experimental import ProvenanceError, provenance, skip, skip_state
from chute.samplers import IndexSampler, SequentialSampler
from chute.sharding import ShardOptions

ROOT = Path(__file__).resolve().parents[2]


def loader(host: int, hosts: int, seed: int = 4, workers: int = 0) -> chute.DataLoader:
    return chute.DataLoader(
        data_source=[{"id": i} for i in range(60)],
        sampler=IndexSampler(60, shuffle=True, num_epochs=2, seed=seed),
        operations=[chute.Batch(4)],
        shard_options=ShardOptions(host, hosts),
        worker_count=workers,
    )


def batches(source: Any) -> list[list[int]]:
    it = iter(source)
    try:
        return [np.asarray(b["id"] if isinstance(b, dict) else b).tolist() for b in it]
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def state_after(ld: Any, steps: int) -> Any:
    it = iter(ld)
    try:
        for _ in range(steps):
            next(it)
        return it.get_state()
    finally:
        it.close()


def test_every_named_hosts_records_of_a_step_from_one_hosts_state() -> None:
    hosts = {h: loader(h, 3) for h in range(3)}
    per_host = {h: batches(ld) for h, ld in hosts.items()}
    state = state_after(loader(1, 3), 2)  # host 1's checkpoint
    steps = [0, 5, 9]
    found = provenance(state, steps, hosts=hosts)
    for k, step in zip(steps, found):
        assert [r["host"] for r in step] == [h for h in range(3) for _ in per_host[h][k]]
        assert [r["index"] for r in step] == [i for h in range(3) for i in per_host[h][k]]
    # A live iterator of one host, with two of the hosts named.
    it = iter(loader(2, 3))
    try:
        two = provenance(it, steps, hosts={0: hosts[0], 2: hosts[2]})
    finally:
        it.close()
    assert two == [[r for r in step if r["host"] != 1] for step in found]
    # One host's own records are those provenance gives without hosts=.
    alone = provenance(state, steps, dataset=loader(1, 3))
    assert [[{"host": 1, **r} for r in s] for s in alone] == [
        [r for r in s if r["host"] == 1] for s in found
    ]


def test_hosts_bad_input_is_refused_naming_the_fix() -> None:
    hosts = {h: loader(h, 2) for h in range(2)}
    state = state_after(loader(0, 2), 1)
    with pytest.raises(chute.CheckpointError, match=r"none of the pipelines of hosts \[0, 1\]"):
        provenance(state_after(loader(0, 2, seed=5), 1), [0], hosts=hosts)
    with pytest.raises(ValueError, match=r"both dataset= and hosts="):
        provenance(state, [0], dataset=hosts[0], hosts=hosts)
    bads: list[Any] = [{}, [hosts[0], hosts[1]]]
    for bad in bads:
        with pytest.raises(TypeError, match=r"hosts=.* is invalid: give a mapping"):
            provenance(state, [0], hosts=bad)
    with pytest.raises(ProvenanceError, match=r"step 30 is beyond the end"):
        provenance(state, [30], hosts=hosts)  # 2 epochs of 30 records, 4 a batch: 15 steps


def host_mixture(host: int, hosts: int) -> chute.IterDataset[Any]:
    parts = [chute.MapDataset.range(s, s + 40)[host::hosts].to_iter_dataset() for s in (0, 100)]
    return chute.IterDataset.mix({"a": parts[0], "b": parts[1]}, {"a": 1, "b": 1}).batch(2)


def test_weights_set_at_run_time_are_one_hosts_and_refused_for_the_others() -> None:
    from chute.experimental import set_mix_weights

    hosts = {h: host_mixture(h, 2) for h in range(2)}
    it = iter(host_mixture(1, 2))
    try:
        next(it)
        assert len(provenance(it, [3], hosts=hosts)[0]) == 4  # no weights set: both hosts
        set_mix_weights(it, {"a": 0, "b": 1})
        next(it)
        assert provenance(it, [3], hosts={1: hosts[1]})[0] == [
            {"host": 1, **r} for r in provenance(it, [3])[0]
        ]
        with pytest.raises(ProvenanceError, match=r"host 1's\) records weights set at run"):
            provenance(it, [3], hosts=hosts)
    finally:
        it.close()


def test_every_ranks_records_of_the_torch_layer_from_one_ranks_state() -> None:
    pytest.importorskip("torch")
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from chute.torch import IterableDataset

    src = chute.MapDataset.range(50).shuffle(seed=3)

    def rank(r: int) -> Any:
        return IterableDataset(src, batch_size=4, shard_options=ShardOptions(r, 2))

    per_rank = {}
    states = {}
    for r in range(2):
        ld = stateful.StatefulDataLoader(rank(r), batch_size=None, num_workers=2)
        per_rank[r] = batches(ld)
        states[r] = ld.state_dict()
    found = provenance(states[1], range(len(per_rank[0])), hosts={0: rank(0), 1: rank(1)})
    for k, step in enumerate(found):
        assert [r["index"] for r in step] == per_rank[0][k] + per_rank[1][k]
        assert [r["host"] for r in step] == [0] * len(per_rank[0][k]) + [1] * len(per_rank[1][k])


def not_third(x: int) -> bool:
    return x % 3 != 0


def test_elastic_iterator_hosts_make_the_global_batches_together() -> None:
    """ElasticIterator: a step of all hosts is its global batch, each host's part of it."""
    from chute.experimental import ElasticIterator

    ds = chute.MapDataset.range(40).seed(1).shuffle().filter(not_third)
    per_host = [batches(ElasticIterator(ds, 6, ShardOptions(h, 2))) for h in range(2)]
    hosts = {h: ElasticIterator(ds, 6, ShardOptions(h, 2)) for h in range(2)}
    one = ElasticIterator(ds, 6, ShardOptions(1, 2))
    next(one)
    found = provenance(one.get_state(), range(4), hosts=hosts)
    one.close()
    for k, step in enumerate(found):
        assert [r["index"] for r in step] == per_host[0][k] + per_host[1][k]
        assert [r["host"] for r in step] == [0, 0, 0, 1, 1, 1]


_JAX_HOST = textwrap.dedent(
    """
    import json, sys
    import jax
    jax.distributed.initialize(
        coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2])
    )
    sys.path.insert(0, sys.argv[3])
    import chute
    from test_provenance_hosts_samplers import loader
    options = chute.sharding.shard_by_jax_process()
    ld = loader(options.shard_index, options.shard_count)
    it = iter(ld)
    seen = [next(it)["id"].tolist() for _ in range(3)]
    print(json.dumps({"host": options.shard_index, "seen": seen, "state": it.state_dict()}))
    it.close()
    jax.distributed.shutdown()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_real_jax_processes_one_hosts_checkpoint_names_both_hosts_records() -> None:
    pytest.importorskip("jax")
    address = f"127.0.0.1:{_free_port()}"
    env = {"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _JAX_HOST, address, str(i), str(Path(__file__).parent)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = {}
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
        got = json.loads(out.strip().splitlines()[-1])
        outs[got["host"]] = got
    assert sorted(outs) == [0, 1]
    hosts = {h: loader(h, 2) for h in range(2)}
    for h in range(2):  # each host's saved state (a state_dict) names both hosts' steps
        found = provenance(outs[h]["state"], range(3), hosts=hosts)
        assert [[r["index"] for r in step] for step in found] == [
            outs[0]["seen"][k] + outs[1]["seen"][k] for k in range(3)
        ]


# -- samplers -------------------------------------------------------------------------------


class EveryThird:
    """A sampler of the user's: step `i` reads record `(3 * i) % n`, for two passes."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return 2 * self._n

    def __getitem__(self, index: int) -> chute.RecordMetadata:
        return chute.RecordMetadata(
            index=index, record_key=(3 * index + index // self._n) % self._n
        )

    def __repr__(self) -> str:
        return f"EveryThird({self._n})"


class NamedKeys(EveryThird):
    """A sampler whose record keys are names, not record indices."""

    def __getitem__(self, index: int) -> chute.RecordMetadata:
        return chute.RecordMetadata(index=index, record_key=f"r{index}")  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"NamedKeys({self._n})"


def sampled(sampler: Any, workers: int = 0) -> chute.DataLoader:
    return chute.DataLoader(
        data_source=[{"id": i} for i in range(90)],
        sampler=sampler,
        operations=[chute.Batch(3)],
        worker_count=workers,
    )


SAMPLERS = {
    "index": lambda: IndexSampler(90, shuffle=True, seed=1, num_epochs=2),
    "index-shard": lambda: IndexSampler(90, ShardOptions(1, 3), shuffle=True, seed=1, num_epochs=1),
    "sequential": lambda: SequentialSampler(90),
    "sequential-shard": lambda: SequentialSampler(90, ShardOptions(2, 3)),
    "users": lambda: EveryThird(90),
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_every_kind_of_sampler_names_its_records_and_skip_lands(kind: str, workers: int) -> None:
    make = SAMPLERS[kind]
    expected = batches(sampled(make()))
    it = iter(sampled(make(), workers))
    try:
        found = provenance(it, range(len(expected)))
        assert [[r["index"] for r in step] for step in found] == expected
        assert skip(it, 4) == 4
        assert next(it)["id"].tolist() == expected[4]
        state = it.get_state()
    finally:
        it.close()
    moved = skip_state(state, 2)  # O(1): positions are index arithmetic
    again = iter(sampled(make(), 2 - workers))
    try:
        again.set_state(moved)
        assert next(again)["id"].tolist() == expected[7]
    finally:
        again.close()
    assert provenance(moved, [7], dataset=sampled(make())) == [found[7]]


def test_a_users_sampler_records_say_which_step_of_the_sampler_read_them() -> None:
    (step,) = provenance(iter(sampled(EveryThird(90))), [40])
    assert [r["sampler_index"] for r in step] == [120, 121, 122]
    assert [r["index"] for r in step] == [(3 * i + 1) % 90 for i in (120, 121, 122)]
    assert {r["epoch"] for r in step} == {None}  # the sampler's own passes are its own


def test_a_sampler_whose_keys_are_not_record_indices_is_named() -> None:
    with pytest.raises(
        ProvenanceError, match=r"sampler NamedKeys\(90\) gave .* record_key 'r3' is not a record"
    ):
        provenance(iter(sampled(NamedKeys(90))), [1])
