"""Readers under one `mp_prefetch(RayWorkers(...))`, each advanced on a thread of its own
(`prefetch(n)` branches mixed or zipped), with actors resized from the consumer's thread
meanwhile: the elements of the same pipeline with no workers, every run. On a real
one-node Ray cluster (`ray.init(num_cpus=2)`), as test_ray_workers.py."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chute
import mp_pipelines as mpp
import ray_helpers as rh

sys.path.insert(0, str(Path(__file__).parent))
from test_mp_prefetch_threads import BUILDERS, _branch

RUNS = 3

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray() -> Iterator[Any]:
    yield from rh.local_cluster()


@pytest.mark.parametrize("case", ["mix", "zip"])
def test_prefetched_branches_on_ray_actors_every_run(ray: Any, case: str) -> None:
    reference = mpp.as_list(BUILDERS[case](0))
    for run in range(RUNS):
        assert mpp.as_list(BUILDERS[case](rh.workers(2))) == reference, f"run {run}"


def test_resizing_while_prefetch_threads_read_changes_nothing(ray: Any) -> None:
    branches = [_branch(0).prefetch(3), _branch(10_000).prefetch(3)]
    ds = chute.IterDataset.mix(branches, [1.0, 2.0])
    reference = list(ds)
    it = iter(ds.mp_prefetch(rh.workers(2)))
    try:
        out = []
        for i, x in enumerate(it):
            out.append(x)
            if i in (20, 120):
                chute.ray.resize(it, 1 if i == 20 else 3)
    finally:
        it.close()
    assert out == reference
