"""`chute.ray.RayWorkers` on a real one-node Ray cluster (`ray.init(num_cpus=2)`, shared by
the module): the same bytes and states as local workers and as none, results through the
object store with bounded chunks in flight, errors at their element, actors killed,
added and removed mid-epoch. Two-node faults are in test_ray_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
import mp_pipelines as mpp
import ray_helpers as rh
import shard_helpers as sh
from chute.experimental import InterleaveIterDataset
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


@pytest.fixture(scope="module")
def ray() -> Iterator[Any]:
    yield from rh.local_cluster()


# -- the options, without a cluster --------------------------------------------------------


def test_options_check_their_values_and_name_the_fix() -> None:
    pytest.importorskip("ray", reason=rh.SKIP_REASON)
    from chute.ray import RayWorkers

    assert isinstance(RayWorkers(2), chute.MultiprocessingOptions)
    with pytest.raises(ValueError, match=r"num_workers=0 is invalid.*MultiprocessingOptions"):
        RayWorkers(0)
    with pytest.raises(ValueError, match=r"max_chunks_in_flight=0 is invalid"):
        RayWorkers(2, max_chunks_in_flight=0)
    with pytest.raises(ValueError, match=r"resources_per_worker has 'CPU': -1"):
        RayWorkers(2, resources_per_worker={"CPU": -1})
    with pytest.raises(ValueError, match=r"actor_options sets \['lifetime'\].*never detached"):
        RayWorkers(2, actor_options={"lifetime": "detached"})
    with pytest.raises(ValueError, match=r"chunk_s=0 is invalid"):
        RayWorkers(2, chunk_s=0)
    with pytest.raises(TypeError, match=r"address=6379 is not a string"):
        RayWorkers(2, address=6379)  # type: ignore[arg-type]
    resources = RayWorkers(1, resources_per_worker={"CPU": 2, "GPU": 1, "disk": 1})
    assert resources.actor_resources() == {"num_cpus": 2, "num_gpus": 1, "resources": {"disk": 1}}


def test_without_ray_the_error_names_the_extra() -> None:
    code = "import sys; sys.modules['ray'] = None\nimport chute.ray"
    env = {**os.environ, "PYTHONPATH": rh.SRC}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode != 0
    assert "chute.ray needs Ray, which is not installed: pip install 'chute[ray]'" in run.stderr


def test_chute_and_local_workers_do_not_import_ray() -> None:
    code = (
        "import sys, chute\n"
        "ds = chute.MapDataset.range(8).to_iter_dataset()\n"
        "assert list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1))) == list(range(8))\n"
        "print('ray' in sys.modules, 'chute.ray' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": rh.SRC}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]


# -- same bytes, same states ---------------------------------------------------------------


def test_same_output_for_1_2_4_actors_as_for_no_workers(ray: Any) -> None:
    reference = mpp.as_list(rh.packed_pipeline(chute.MultiprocessingOptions(num_workers=0)))
    assert len(reference) > 20
    for n in (1, 2, 4):
        assert_trees_equal(mpp.as_list(rh.packed_pipeline(rh.workers(n))), reference)


def test_states_move_between_ray_and_local_workers(ray: Any) -> None:
    local = chute.MultiprocessingOptions(num_workers=1)
    assert_equal_output_after_checkpoint(
        rh.packed_pipeline(rh.workers(2)),
        restore_into=rh.packed_pipeline(local),
        steps=[0, 5, 17],
    )
    assert_equal_output_after_checkpoint(
        rh.packed_pipeline(local),
        restore_into=rh.packed_pipeline(rh.workers(2)),
        steps=[3, 11],
    )


def test_rich_pipeline_and_its_state_shape_as_without_workers(ray: Any) -> None:
    ds = mpp.rich_pipeline(0)
    above: chute.IterDataset[Any] = ds.parents[0]  # type: ignore[assignment]
    ray_ds = above.mp_prefetch(rh.workers(2))
    it, ref = iter(ray_ds), iter(ds)
    for _ in range(9):
        assert_trees_equal(next(it), next(ref))
    assert it.get_state() == ref.get_state()
    assert_trees_equal(list(it), list(ref))


def test_dataloader_takes_ray_workers(ray: Any) -> None:
    def loader(**kw: Any) -> chute.DataLoader:
        return chute.DataLoader(
            data_source=list(range(300)),
            sampler=chute.IndexSampler(300, shuffle=True, seed=2, num_epochs=1),
            operations=[mpp.keep_transform(), chute.Batch(8)],
            **kw,
        )

    reference = [b.tolist() for b in loader()]
    got = loader(multiprocessing_options=rh.workers(2))
    assert got.multiprocessing_options == rh.workers(2)
    assert [b.tolist() for b in got] == reference
    with pytest.raises(ValueError, match="pass one"):
        loader(worker_count=2, multiprocessing_options=rh.workers(2))


def test_prefetch_and_elastic_iterator_take_ray_workers(ray: Any) -> None:
    from chute.experimental import ElasticIterator

    ds = chute.MapDataset.range(60).shuffle(seed=3).filter(mpp.keep)
    shard = chute.sharding.ShardOptions(1, 2)
    plain = [b.tolist() for b in ElasticIterator(ds, 4, shard)]
    elastic = ElasticIterator(ds, 4, shard, multiprocessing_options=rh.workers(2))
    assert [b.tolist() for b in elastic] == plain
    it = iter(ds.to_iter_dataset().prefetch(rh.workers(1)))
    assert rh.services(it) and list(it) == [x for x in ds if x is not None]


def test_streams_are_read_by_shard_in_actors(ray: Any) -> None:
    def streams(options: Any) -> chute.IterDataset[Any]:
        shards = [chute.IterDataset.source(sh.Rows(s, 3 + 5 * s)) for s in range(6)]
        ds = InterleaveIterDataset(shards, cycle_length=4, iter_buffer_size=3)
        return ds.map(sh.key).mp_prefetch(options)

    reference = mpp.as_list(streams(chute.MultiprocessingOptions(num_workers=0)))
    assert mpp.as_list(streams(rh.workers(2))) == reference
    assert_equal_output_after_checkpoint(
        streams(rh.workers(2)), restore_into=streams(rh.workers(1)), steps=[0, 7, 30]
    )


# -- through the object store, bounded -------------------------------------------------------


def test_arrays_arrive_as_views_of_the_object_store(ray: Any) -> None:
    ds = chute.MapDataset.range(12).map(rh.image).to_iter_dataset().mp_prefetch(rh.workers(2))
    it = iter(ds)
    elements = [next(it) for _ in range(12)]
    it.close()
    for i, x in enumerate(elements):
        assert int(x["label"]) == i and float(x["image"][0, 0]) == i
    # Views of the store's buffer: neither owned nor writable (Ray's read-only objects).
    late = [x["image"] for x in elements[1:]]  # the first is computed here while actors start
    assert all(not a.flags.owndata and not a.flags.writeable for a in late)


def test_chunks_in_flight_are_bounded(ray: Any, tmp_path: Path) -> None:
    done = tmp_path / "computed"
    done.mkdir()
    touch = rh.Touch(str(done), sleep=0.002)
    ds = chute.MapDataset.range(20_000).map(touch).to_iter_dataset()
    it = iter(ds.mp_prefetch(rh.workers(2, max_chunks_in_flight=3)))
    taken = [next(it) for _ in range(200)]
    time.sleep(2.0)  # unbounded, the 2 actors would compute ~2,000 more meanwhile
    computed = len(os.listdir(done))
    it.close()
    assert taken == list(range(200))
    # At most 3 chunks ahead of the consumer; a chunk holds ~20 ms of work (10 elements
    # here), growing at most 4-fold per result: 3 * 64 is far above what they may hold.
    assert 200 <= computed <= 200 + 3 * 64, computed


# -- errors ------------------------------------------------------------------------------------


def test_a_stage_raising_in_an_actor_has_its_traceback_and_index(ray: Any) -> None:
    ds = chute.MapDataset.range(40).map(mpp.fail_at_13).to_iter_dataset()
    it = iter(ds.mp_prefetch(rh.workers(2)))
    got = []
    with pytest.raises(ValueError, match="cannot handle 13") as info:
        for x in it:
            got.append(x)
    assert got == list(range(13))
    notes = "\n".join(info.value.__notes__)
    assert "MapMapDataset(transform=fail_at_13" in notes and "element index 13" in notes
    assert "raised in Ray actor" in notes and "(pid" in notes  # and its node
    cause = info.value.__cause__
    assert cause is not None and "fail_at_13" in str(cause)  # the actor's traceback


def test_an_element_that_cannot_be_pickled_is_named_by_index(ray: Any) -> None:
    ds = chute.MapDataset.range(10).map(rh.lock_at_5).to_iter_dataset()
    it = iter(ds.mp_prefetch(rh.workers(1)))
    got = []
    with pytest.raises(TypeError) as info:
        for x in it:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    assert "the element at index 5 cannot be pickled" in "\n".join(info.value.__notes__)


def test_a_module_missing_on_the_actors_node_is_named_with_the_fix(
    ray: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Importable here (on sys.path), not in the actors (not on the cluster's PYTHONPATH).
    (tmp_path / "only_here.py").write_text("def triple(x):\n    return 3 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_here

    try:
        ds = chute.MapDataset.range(20).map(only_here.triple).to_iter_dataset()
        with pytest.raises(ModuleNotFoundError, match="only_here") as info:
            mpp.as_list(ds.mp_prefetch(rh.workers(1)))
    finally:
        del sys.modules["only_here"]
    notes = "\n".join(info.value.__notes__)
    assert "raised in Ray actor 0 of 1 (pid" in notes and "importable on every node" in notes


def test_worker_init_fn_runs_in_each_actor(ray: Any, tmp_path: Path) -> None:
    ds = chute.MapDataset.range(30).to_iter_dataset()
    staged = ds.mp_prefetch(rh.workers(2), worker_init_fn=rh.MarkWorker(str(tmp_path)))
    assert mpp.as_list(staged) == list(range(30))
    marks = sorted(p.name.rsplit("-pid-", 1)[0] for p in tmp_path.iterdir())
    assert marks == ["worker-0-of-2", "worker-1-of-2"]


def test_a_stalled_actor_is_named_then_given_up_on(ray: Any) -> None:
    ds = chute.MapDataset.range(6).map(rh.sleep_at_3).to_iter_dataset()
    # timeout_s also bounds the actor's start, which takes seconds on a loaded machine
    options = rh.workers(1, stall_warning_s=0.5, timeout_s=8)
    it = iter(ds.mp_prefetch(options))
    with warnings.catch_warnings():  # the actor's start may take longer than 0.5 s
        warnings.simplefilter("ignore", chute.multiprocessing.WorkerStallWarning)
        assert [next(it) for _ in range(3)] == [0, 1, 2]
    with (
        pytest.warns(chute.multiprocessing.WorkerStallWarning, match=r"Ray actor 0 of 1 \(pid"),
        pytest.raises(chute.multiprocessing.WorkerTimeoutError, match=r"element index 3"),
    ):
        next(it)


def test_an_actor_no_node_can_hold_is_reported_with_what_it_waits_for(ray: Any) -> None:
    options = rh.workers(
        1, resources_per_worker={"CPU": 0.25, "nowhere": 1}, stall_warning_s=None, timeout_s=1.5
    )
    it = iter(chute.MapDataset.range(6).to_iter_dataset().mp_prefetch(options))
    assert next(it) == 0  # computed here while the actors start
    with pytest.raises(chute.multiprocessing.WorkerTimeoutError) as info:
        next(it)
    message = str(info.value)
    assert "Ray actor 0 of 1, asked to compute element index 1, has not started" in message
    assert "{'CPU': 0.25, 'nowhere': 1} free (free now: {'CPU':" in message
    assert "'nowhere': 0}" in message


def test_enable_profiling_prints_the_summary_with_the_actors_figures(
    ray: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    options = rh.workers(2, enable_profiling=True)
    ds = chute.MapDataset.range(64).map(mpp.double).to_iter_dataset().batch(8)
    assert len(mpp.as_list(ds.mp_prefetch(options))) == 8
    err = capsys.readouterr().err
    assert err.count("chute execution summary") == 1 and "MapMapDataset" in err, err


# -- faults and elasticity -----------------------------------------------------------------


def test_an_actor_killed_mid_epoch_loses_and_repeats_nothing(ray: Any) -> None:
    reference = mpp.as_list(rh.slow_pipeline(chute.MultiprocessingOptions(num_workers=0)))
    it = iter(rh.slow_pipeline(rh.workers(2)))
    out = [next(it) for _ in range(30)]
    actors = rh.pool(it).actors
    victim = actors[0]
    assert victim.tickets, "the victim owes chunks when it is killed"
    retried = _count_calls(rh.services(it)[0], "_retry")
    ray.kill(victim.handle)
    out += list(it)
    assert retried, "chunks the victim owed were computed again"
    assert victim.dead and victim not in rh.pool(it).actors
    assert len(rh.pool(it).actors) == 2  # its slot has a new actor
    it.close()
    assert_trees_equal(out, reference)


def test_a_killed_actor_holding_shards_has_them_reopened_elsewhere(ray: Any) -> None:
    def streams(options: Any) -> chute.IterDataset[Any]:
        shards = [chute.IterDataset.source(sh.SlowRows(s, 40, 0.001)) for s in range(4)]
        ds = InterleaveIterDataset(shards, cycle_length=4, iter_buffer_size=3)
        return ds.map(sh.key).mp_prefetch(options)

    reference = mpp.as_list(streams(chute.MultiprocessingOptions(num_workers=0)))
    it = iter(streams(rh.workers(2)))
    out = [next(it) for _ in range(30)]
    (service,) = rh.services(it)
    holders = {id(s.actor): s.actor for s in service._shards.values() if s.actor is not None}
    assert holders, "shards are open in the actors"
    victim = next(iter(holders.values()))
    moved = _count_calls(service, "_move")
    ray.kill(victim.handle)
    out += list(it)
    it.close()
    assert victim.dead and moved, "the victim's shards were opened on another actor"
    assert out == reference


def _count_calls(obj: Any, name: str) -> list[Any]:
    """Records each call of `obj.name` (still made) in the list returned."""
    calls: list[Any] = []
    method = getattr(obj, name)

    def recorded(*args: Any, **kw: Any) -> Any:
        calls.append(args)
        return method(*args, **kw)

    setattr(obj, name, recorded)
    return calls


def test_actors_added_and_removed_mid_epoch_change_neither_output_nor_state(ray: Any) -> None:
    from chute.ray import resize

    reference = iter(rh.slow_pipeline(chute.MultiprocessingOptions(num_workers=0), n=800))
    it = iter(rh.slow_pipeline(rh.workers(1), n=800))
    for step in range(80):
        if step == 10:
            resize(it, 3)  # scale up
        if step == 40:
            resize(it, 1)  # scale down: two actors retire once they owe nothing
        assert_trees_equal(next(it), next(reference))
        assert it.get_state() == reference.get_state()
    assert [a.slot for a in rh.pool(it).actors] == [0]
    it.close()
    with pytest.raises(ValueError, match="has no Ray workers"):
        resize(iter(mpp.rich_pipeline(0)), 2)


def test_close_ends_the_actors(ray: Any) -> None:
    before = rh.chunk_actors()
    it = iter(rh.slow_pipeline(rh.workers(2)))
    next(it)
    mine = rh.chunk_actors() - before
    assert len(mine) == 2
    it.close()
    assert rh.wait_until(lambda: not (rh.chunk_actors() & mine))


def test_autotune_counts_the_clusters_cpus(ray: Any) -> None:
    from chute.ray import RayWorkers

    it = iter(rh.slow_pipeline(RayWorkers(resources_per_worker={"CPU": 0.5}), n=100))
    next(it)
    parallelism = it.parallelism()
    assert parallelism is not None and parallelism.processes == 4  # 2 CPUs, half a CPU each
    tuning = it.tuning()
    assert tuning is not None and tuning.current == {"num_workers": 4}
    assert "2 CPUs in the Ray cluster, 0.5 per actor" in tuning.decisions[0].reason
    it.close()


def test_results_are_the_same_bytes(ray: Any) -> None:
    def images(options: Any) -> list[Any]:
        ds = chute.MapDataset.range(8).shuffle(seed=1).map(rh.image).to_iter_dataset()
        return mpp.as_list(ds.batch(3).mp_prefetch(options))

    for a, b in zip(images(rh.workers(2)), images(chute.MultiprocessingOptions(num_workers=0))):
        assert a["image"].tobytes() == b["image"].tobytes()
        assert np.array_equal(a["label"], b["label"])


def test_a_script_run_with_ray_workers(ray: Any, tmp_path: Path) -> None:
    """A user's script, functions in `__main__` included, connecting to this cluster."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import chute
            from chute.ray import RayWorkers

            def square(x):
                return x * x

            ds = chute.MapDataset.range(50).map(square).to_iter_dataset().batch(10)
            opts = RayWorkers(2, address="auto", resources_per_worker={"CPU": 0.25})
            print([int(b.sum()) for b in ds.mp_prefetch(opts)])
            """
        )
    )
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ADDRESS": address, "PYTHONPATH": rh.SRC}
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    expected = [sum(x * x for x in range(k, k + 10)) for k in range(0, 50, 10)]
    assert run.stdout.strip().splitlines()[-1] == str(expected)
