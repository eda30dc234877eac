"""`chute.ray.RayWorkers` on a real two-node cluster (`ray.cluster_utils.Cluster` on
127.0.0.1, shared by the module): a node removed mid-epoch loses and repeats nothing, and
a trainer killed with SIGKILL leaves no actor behind."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

import chute
import ray_helpers as rh
from chute.testing import assert_trees_equal

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    pytest.importorskip("ray", reason=rh.SKIP_REASON)
    import ray
    from ray.cluster_utils import Cluster

    with rh.actors_import_the_tests():
        nodes = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
        )
    try:
        with rh.actors_import_the_tests():
            nodes.add_node(num_cpus=1)
        ray.init(address=nodes.address, logging_level=logging.ERROR, log_to_driver=False)
        nodes.wait_for_nodes()
        yield nodes
    finally:
        ray.shutdown()
        nodes.shutdown()


def test_a_node_removed_mid_epoch_loses_and_repeats_nothing(cluster: Any) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with rh.actors_import_the_tests():
        doomed = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    # The actors start on the node to be removed; their replacements go where they can.
    there = NodeAffinitySchedulingStrategy(node_id=doomed.node_id, soft=True)
    options = rh.workers(2, actor_options={"scheduling_strategy": there})
    reference = list(rh.slow_pipeline(chute.MultiprocessingOptions(num_workers=0)))
    it = iter(rh.slow_pipeline(options))
    out = [next(it) for _ in range(40)]
    actors = list(rh.pool(it).actors)
    assert all(a.place is not None and a.place.node_id == doomed.node_id for a in actors)
    assert any(a.tickets for a in actors), "chunks are in flight on the node removed"
    cluster.remove_node(doomed)
    out += list(it)
    assert all(a.dead for a in actors)
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert all(a.place.node_id in alive for a in rh.pool(it).actors)
    it.close()
    assert_trees_equal(out, reference)


def test_a_trainer_killed_with_sigkill_leaves_no_actor(cluster: Any, tmp_path: Any) -> None:
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent(
            """
            import time
            import ray_helpers as rh

            it = iter(rh.slow_pipeline(rh.workers(2, address="auto"), n=10**6))
            actors = rh.pool(it).actors
            while not all(a.place is not None for a in actors):  # both actors started
                next(it)
            print(*[a.handle._actor_id.hex() for a in actors], flush=True)
            print(*[a.place.pid for a in actors], flush=True)
            time.sleep(600)
            """
        )
    )
    env = {
        **os.environ,
        "RAY_ADDRESS": cluster.address,
        "PYTHONPATH": os.pathsep.join([rh.SRC, rh.TESTS]),
    }
    trainer = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        ids = set(trainer.stdout.readline().split())  # type: ignore[union-attr]
        pids = [int(p) for p in trainer.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(ids) == 2 and len(pids) == 2
        assert ids <= rh.chunk_actors()
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    assert rh.wait_until(lambda: not (ids & rh.chunk_actors()), timeout=60)
    assert rh.wait_until(lambda: all(gone(p) for p in pids), timeout=30)
