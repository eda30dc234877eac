"""Shared by the tests of `chute.ray` (workers on a Ray cluster): starting and stopping a
real cluster on 127.0.0.1, module-level functions its actors can import, and looking at
the actors a pipeline has."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import chute

SKIP_REASON = "Ray is not installed: pip install 'chute[ray]'"
TESTS = str(Path(__file__).resolve().parent)
SRC = str(Path(chute.__file__).resolve().parents[1])


@contextlib.contextmanager
def actors_import_the_tests() -> Iterator[None]:
    """While a cluster is started: its processes (hence its actors) find this checkout's
    chute and the tests' helper modules (they inherit this process's environment)."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([SRC, TESTS, *([old] if old else [])])
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def local_cluster() -> Iterator[Any]:
    """A module fixture's body: a local Ray cluster of 2 CPUs whose actors import this
    checkout, shut down after the module (skipped where Ray is not installed)."""
    import logging

    import pytest

    ray = pytest.importorskip("ray", reason=SKIP_REASON)
    with actors_import_the_tests():
        ray.init(
            num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False
        )
    try:
        yield ray
    finally:
        ray.shutdown()


def workers(n: int, **kw: Any) -> Any:
    """`RayWorkers(n)` that fit a 2-CPU test cluster (a quarter of a CPU each)."""
    from chute.ray import RayWorkers

    kw.setdefault("resources_per_worker", {"CPU": 0.25})
    return RayWorkers(num_workers=n, **kw)


def services(it: chute.DatasetIterator[Any]) -> list[Any]:
    from chute._src.exec.ray.service import _services

    return _services(it)


def pool(it: chute.DatasetIterator[Any]) -> Any:
    (service,) = services(it)
    return service._pool


def chunk_actors(states: tuple[str, ...] = ("ALIVE", "PENDING_CREATION", "RESTARTING")) -> set[str]:
    """The ids of chute's actors in the cluster (all jobs) in one of `states`, from the
    cluster's own table (GCS)."""
    from ray._private import state

    return {
        actor_id
        for actor_id, info in state.actors().items()
        if info.get("ActorClassName", "").endswith("ChunkActor") and info.get("State") in states
    }


def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


# -- pipelines (module level: actors import this module) ---------------------------------


def tokens(i: int) -> np.ndarray:
    """A record as a variable-length sequence of token ids (1 to 12 tokens)."""
    return np.arange(1 + i % 12, dtype=np.int64) + 1000 * i


def crop(x: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A random crop keeping at least one token."""
    keep = int(rng.integers(1, len(x) + 1))
    return {"t": x[:keep]}


def not_seven(x: dict[str, np.ndarray]) -> bool:
    return int(x["t"][0]) % 7 != 0


def slow_double(x: int) -> int:
    time.sleep(0.002)
    return 2 * x


def image(i: int) -> dict[str, Any]:
    return {"image": np.full((256, 1024), i, dtype=np.float32), "label": i}


def packed_pipeline(options: Any, n: int = 600) -> chute.IterDataset[Any]:
    """shuffle, map, random_map and filter (moved into the workers), then packing and
    batching after the worker boundary (in this process)."""
    from chute.experimental import FirstFitPackIterDataset

    ds = (
        chute.MapDataset.range(n)
        .shuffle(seed=5)
        .map(tokens)
        .random_map(crop, seed=11)
        .filter(not_seven)
        .to_iter_dataset()
    )
    packed = FirstFitPackIterDataset(ds, length_struct={"t": 16}, num_packing_bins=3, seed=2)
    return packed.batch(4).mp_prefetch(options)


def slow_pipeline(options: Any, n: int = 1500) -> chute.IterDataset[Any]:
    """About 2 ms per element, so chunks are in flight whenever one looks."""
    ds = chute.MapDataset.range(n).shuffle(seed=3).map(slow_double).to_iter_dataset()
    return ds.batch(10).mp_prefetch(options)


class Touch:
    """`i -> i`, leaving a file named `i` in `directory` (what was computed, and where)."""

    def __init__(self, directory: str, sleep: float = 0.0) -> None:
        self.directory, self.sleep = directory, sleep

    def __call__(self, i: int) -> int:
        time.sleep(self.sleep)
        Path(self.directory, str(i)).touch()
        return i


class MarkWorker:
    """A worker_init_fn that leaves a file per actor."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, index: int, count: int) -> None:
        Path(self.directory, f"worker-{index}-of-{count}-pid-{os.getpid()}").touch()


def sleep_at_3(i: int) -> int:
    if i == 3:
        time.sleep(30)
    return i


def lock_at_5(i: int) -> Any:
    import threading

    return threading.Lock() if i == 5 else i
