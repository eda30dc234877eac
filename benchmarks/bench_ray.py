"""`chute.ray.RayWorkers` beside local worker processes and Ray Data, in one run, on one
machine of at least 2 cores: the trainer is pinned to one core, the work it is fed by
runs on another (a second raylet of a local `ray.cluster_utils.Cluster`).

The cluster: a head node with no CPU for tasks (its GCS and raylet share the trainer's
core, as on a trainer host), and a second node of 1 CPU started pinned to the other core,
so its actors and tasks run there. Local worker processes are pinned to that core by
their `worker_init_fn`.

Sections (each prints one table):

- `training`: a training loop whose step burns about as much CPU as preparing one batch
  (64 elements of ~1 ms of pure-Python work each, then `batch(64)`), fed by (a) no
  workers, on the trainer's core; (b) one Ray actor (`RayWorkers(1)`) on the other core;
  (c) one local worker process (`MultiprocessingOptions(1)`) on the other core; (d) Ray
  Data's `map_batches(...).iter_batches(batch_size=64)` over the same work, its tasks on
  the other core. Training steps/s after 5 warm-up steps, best of 3 interleaved rounds;
  each against (a). With the preparation moved off the trainer's core, a step costs the
  trainer its own CPU plus what receiving a batch costs it: (b)/(a) tends to 2.
- `chunks`: a chunk's round trip with nothing else in flight (one element of a trivial
  MapDataset, asked for and waited on, 300 times in a row), through the chunk service of
  local workers (`ChunkService`: pipes and a shared-memory slab) and of Ray actors
  (`RayService`: a task and the object store); the trainer process's CPU per chunk (all
  its threads, Ray's included): what bounds how many chunks per second one trainer can
  take in. (Internal API: the per-chunk cost without chunk sizing in the way.)
- `bytes`: 16 MiB float32 arrays, one per element, made once in the worker and handed
  over: GB/s at the consumer (which reads one value of each) and the trainer's CPU
  seconds per GB, for a local worker (shared memory), a Ray actor (the other node's object
  store, pulled into the head's, read in place) and Ray Data (`iter_batches(batch_size=1)`).

The load average is printed before and after: the machine is shared, and a busy machine
takes CPU from whichever core is busiest. Compare the ratios within one run.

    .venv/bin/python benchmarks/bench_ray.py            # everything, ~3 minutes
    .venv/bin/python benchmarks/bench_ray.py --quick    # fewer steps and bytes
    .venv/bin/python benchmarks/bench_ray.py --only training

Ray Data needs pandas (`pip install 'ray[data]'`); without it that contender is skipped.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chute
from _harness import machine, table

BATCH = 64
MiB = 1 << 20


def burn(n: int) -> int:
    """Pure-Python work (holds the GIL): ~n * 40 ns."""
    x = 0
    for i in range(n):
        x += i * i
    return x


class Element:
    """Element `i`: ~1 ms of pure-Python work, then 256 floats."""

    def __init__(self, iters: int) -> None:
        self.iters = iters

    def __call__(self, i: int) -> np.ndarray:
        return np.full(256, burn(self.iters) % 7 + i, dtype=np.float32)


class ElementBatches:
    """The same work as `Element`, as Ray Data's `map_batches` function."""

    def __init__(self, iters: int) -> None:
        self.element = Element(iters)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"x": np.stack([self.element(int(i)) for i in batch["id"]])}


class PinTo:
    """A `worker_init_fn` pinning the worker process to one core."""

    def __init__(self, core: int) -> None:
        self.core = core

    def __call__(self, index: int, count: int) -> None:
        os.sched_setaffinity(0, {self.core})


class Big:
    """Element `i`: the same 16 MiB float32 array (made once per process), handed over."""

    def __init__(self, mib: int) -> None:
        self.mib = mib
        self._array: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"mib": self.mib, "_array": None}

    def __call__(self, i: int) -> np.ndarray:
        if self._array is None:
            self._array = np.ones(self.mib * MiB // 4, dtype=np.float32)
        return self._array


class BigBatches:
    def __init__(self, mib: int) -> None:
        self.big = Big(mib)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"x": np.stack([self.big(int(i)) for i in batch["id"]])}


def calibrate() -> tuple[int, float]:
    """The iterations of `burn` that take ~1 ms here, and the seconds they take."""
    iters = 20_000
    t0 = time.process_time()
    for _ in range(20):
        burn(iters)
    per = (time.process_time() - t0) / 20
    iters = max(1000, int(iters * 0.001 / per))
    t0 = time.process_time()
    for _ in range(50):
        burn(iters)
    return iters, (time.process_time() - t0) / 50


def start_cluster(trainer_core: int, worker_core: int) -> Any:
    """A head node with no CPU for tasks on the trainer's core, and a node of 1 CPU on the
    other core (each raylet's processes inherit the affinity it is started with)."""
    import ray
    from ray.cluster_utils import Cluster

    store = 1 << 30
    os.sched_setaffinity(0, {trainer_core})
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": store},
    )
    os.sched_setaffinity(0, {worker_core})
    cluster.add_node(num_cpus=1, object_store_memory=store)
    os.sched_setaffinity(0, {trainer_core})
    ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster


def has_ray_data() -> bool:
    try:
        import ray.data  # needs pandas
    except ImportError:
        return False
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    return True


# -- training ----------------------------------------------------------------------------


def chute_batches(n: int, iters: int, options: Any, init: Any = None) -> Iterator[Any]:
    ds = chute.MapDataset.range(n).shuffle(seed=0).map(Element(iters))
    it = ds.to_iter_dataset(chute.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    it = it.batch(BATCH)
    if options is not None:
        it = it.mp_prefetch(options, worker_init_fn=init)
    return iter(it)


def ray_data_batches(n: int, iters: int) -> Iterator[Any]:
    import ray.data

    ds = ray.data.range(n).map_batches(ElementBatches(iters), batch_size=BATCH)
    return iter(ds.iter_batches(batch_size=BATCH, batch_format="numpy", prefetch_batches=2))


def steps_per_s(
    make: Callable[[], Iterator[Any]], steps: int, step_iters: int
) -> tuple[float, float]:
    """Training steps/s after 5 of warm-up, and the trainer process's CPU seconds per step
    (the step's own, and whatever else its threads did: computing batches, receiving)."""
    it = make()
    for _ in range(5):  # warm-up: actors or tasks starting, first chunks
        next(it)
        burn(step_iters)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        next(it)
        burn(step_iters)
    rate = steps / (time.perf_counter() - t0)
    cpu = (time.process_time() - c0) / steps
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return rate, cpu


def training(args: argparse.Namespace, cores: tuple[int, int]) -> None:
    from chute.ray import RayWorkers

    iters, element_s = calibrate()
    step_iters = iters * BATCH  # a step burns what preparing a batch does
    steps = 12 if args.quick else 30
    n = (steps + 10) * BATCH
    print(
        f"\n== training: a batch = {BATCH} elements of {element_s * 1e3:.2f} ms CPU; a step "
        f"burns {BATCH * element_s * 1e3:.0f} ms CPU; {steps} steps after 5 of warm-up"
    )
    runs: dict[str, Callable[[], Iterator[Any]]] = {
        "(a) 0 workers, trainer's core": lambda: chute_batches(n, iters, None),
        "(b) RayWorkers(1), other core": lambda: chute_batches(n, iters, RayWorkers(1)),
        "(c) MultiprocessingOptions(1), other core": lambda: chute_batches(
            n, iters, chute.MultiprocessingOptions(num_workers=1), PinTo(cores[1])
        ),
    }
    if has_ray_data():
        runs["(d) Ray Data iter_batches, other core"] = lambda: ray_data_batches(n, iters)
    else:
        print("(Ray Data skipped: it needs pandas, pip install 'ray[data]')")
    best = {name: (0.0, 0.0) for name in runs}
    for _ in range(2 if args.quick else 3):
        for name, make in runs.items():
            rate, cpu = steps_per_s(make, steps, step_iters)
            if rate > best[name][0]:
                best[name] = (rate, cpu)
    base = best["(a) 0 workers, trainer's core"][0]
    rows = [
        [name, f"{rate:.2f}", f"{rate / base:.2f}", f"{cpu * 1e3:.1f}"]
        for name, (rate, cpu) in best.items()
    ]
    print(table(["fed by", "steps/s", "vs (a)", "trainer CPU ms/step"], rows))
    ratio = best["(b) RayWorkers(1), other core"][0] / base
    print(f"(b)/(a) = {ratio:.2f}: the goal of 1.6 is {'met' if ratio >= 1.6 else 'missed'}")


# -- chunks ------------------------------------------------------------------------------


def round_trips(service: Any, count: int) -> tuple[float, float]:
    """Seconds per chunk round trip, and the trainer's CPU seconds per chunk."""
    for start in range(50):  # warm-up: the worker starts, unpickles the pipeline
        service.result(service.submit(0, start, 1))
    t0, c0 = time.perf_counter(), time.process_time()
    for start in range(50, 50 + count):
        result, failure = service.result(service.submit(0, start, 1))
        assert failure is None and result.items == [start]
    return (time.perf_counter() - t0) / count, (time.process_time() - c0) / count


def chunks(args: argparse.Namespace, cores: tuple[int, int]) -> None:
    from chute._src.exec.ray.service import RayService
    from chute._src.exec.workers.service import ChunkService
    from chute.ray import RayWorkers

    count = 100 if args.quick else 300
    print(f"\n== chunks: {count} round trips of a 1-element chunk, nothing else in flight")
    leaf = chute.MapDataset.range(10**9)
    rows = []
    for name, make in (
        (
            "local worker (pipe + shared memory)",
            lambda: ChunkService(
                [leaf], [], chute.MultiprocessingOptions(num_workers=1), PinTo(cores[1])
            ),
        ),
        ("Ray actor (task + object store)", lambda: RayService([leaf], [], RayWorkers(1), None)),
    ):
        service = make()
        try:
            wall, cpu = round_trips(service, count)
        finally:
            service.close()
        rows.append([name, f"{wall * 1e6:,.0f}", f"{cpu * 1e6:,.0f}"])
    print(table(["through", "us per round trip", "trainer CPU us per chunk"], rows))


# -- bytes -------------------------------------------------------------------------------


def consume(it: Iterator[Any], count: int, pick: Callable[[Any], np.ndarray]) -> float:
    total = 0.0
    for _ in range(count):
        total += float(pick(next(it)).flat[0])
    return total


def gb_per_s(
    make: Callable[[], Iterator[Any]], count: int, mib: int, pick: Any
) -> tuple[float, float]:
    it = make()
    consume(it, 4, pick)  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    consume(it, count, pick)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    close = getattr(it, "close", None)
    if close is not None:
        close()
    gb = count * mib * MiB / 1e9
    return gb / wall, cpu / gb


def bytes_section(args: argparse.Namespace, cores: tuple[int, int]) -> None:
    from chute.ray import RayWorkers

    mib, count = 16, (24 if args.quick else 96)
    print(f"\n== bytes: {count} arrays of {mib} MiB, made once in the worker, handed over")
    n = count + 8

    def chute_big(options: Any, init: Any = None) -> Iterator[Any]:
        ds = chute.MapDataset.range(n).map(Big(mib)).to_iter_dataset()
        return iter(ds.mp_prefetch(options, worker_init_fn=init))

    def ray_data_big() -> Iterator[Any]:
        import ray.data

        ds = ray.data.range(n).map_batches(BigBatches(mib), batch_size=1)
        return iter(ds.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=2))

    runs: dict[str, tuple[Callable[[], Iterator[Any]], Any]] = {
        "local worker (shared memory)": (
            lambda: chute_big(chute.MultiprocessingOptions(num_workers=1), PinTo(cores[1])),
            lambda x: x,
        ),
        "Ray actor (object store)": (lambda: chute_big(RayWorkers(1)), lambda x: x),
    }
    if has_ray_data():
        runs["Ray Data iter_batches"] = (ray_data_big, lambda b: b["x"])
    best = {name: (0.0, float("inf")) for name in runs}
    for _ in range(2):
        for name, (make, pick) in runs.items():
            rate, cpu = gb_per_s(make, count, mib, pick)
            if rate > best[name][0]:
                best[name] = (rate, cpu)
    rows = [[name, f"{rate:.2f}", f"{cpu:.3f}"] for name, (rate, cpu) in best.items()]
    print(table(["through", "GB/s", "trainer CPU s per GB"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["training", "chunks", "bytes"])
    args = parser.parse_args()
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        raise SystemExit("bench_ray.py needs 2 usable cores: one for the trainer, one for work")
    cores = (usable[0], usable[1])
    print(machine())
    print(f"trainer on core {cores[0]}, workers on core {cores[1]}")
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    import ray

    print(f"ray {ray.__version__}")
    cluster = start_cluster(*cores)
    try:
        for name, section in (("training", training), ("chunks", chunks), ("bytes", bytes_section)):
            if args.only in (None, name):
                section(args, cores)
    finally:
        ray.shutdown()
        cluster.shutdown()
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
