"""How fast results move from worker processes to the main process.

Compares chute's shared-memory slab transport (`chute._src.exec.mp.WorkerPool`) with a
`multiprocessing.Queue` and with a new `SharedMemory` segment per array (Grain's
approach), for 1 MiB and 16 MiB float32 arrays from 1 and 2 workers, then measures the
time from creating a pool to having one result from every worker, per start method.

Each worker returns the same pre-built array for every task, so the figures measure the
transport, not the making of data. The consumer drops each array when it gets it.

    python benchmarks/bench_transport.py            # full run, a few minutes
    python benchmarks/bench_transport.py --quick    # smaller totals
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from chute._src.exec.mp import WorkerPool

MiB = 1 << 20
_ARRAYS: dict[int, np.ndarray] = {}


def make_array(nbytes: int) -> np.ndarray:
    if nbytes not in _ARRAYS:
        _ARRAYS[nbytes] = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    return _ARRAYS[nbytes]


def chute_task(index: int, count: int, nbytes: int) -> np.ndarray:
    return make_array(nbytes)


def chute_run(num_workers: int, nbytes: int, count: int, shm: int | None = None) -> float:
    """`shm=None`: the default slab, which grows to fit; `shm=0`: pipes only."""
    buffer_size = 3
    with WorkerPool(
        num_workers, chute_task, buffer_size=buffer_size, shm_bytes_per_worker=shm
    ) as pool:
        for w in range(num_workers):  # warm up: workers started, arrays built
            pool.put(w, nbytes)
        for w in range(num_workers):
            pool.get(w)
        start = time.perf_counter()
        put = 0
        for k in range(count):
            while put < count and put < k + num_workers * buffer_size:
                pool.put(put % num_workers, nbytes)
                put += 1
            pool.get(k % num_workers)
        return time.perf_counter() - start


def queue_worker(queue: Any, nbytes: int, count: int) -> None:
    array = make_array(nbytes)
    for _ in range(count):
        queue.put(array)


def segment_worker(queue: Any, nbytes: int, count: int) -> None:
    array = make_array(nbytes)
    for _ in range(count):
        shm = SharedMemory(create=True, size=nbytes)
        np.ndarray(array.shape, array.dtype, buffer=shm.buf)[:] = array
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        queue.put((shm.name, array.shape, array.dtype.str))
        shm.close()


def segment_receive(message: tuple[str, tuple[int, ...], str]) -> None:
    name, shape, dtype = message
    shm = SharedMemory(name=name)  # registers it with the tracker; unlink unregisters
    array = np.ndarray(shape, np.dtype(dtype), buffer=shm.buf)
    array[0]  # the consumer has its (zero-copy) array; then drops it
    del array
    shm.close()
    shm.unlink()


def baseline_run(
    worker: Callable[..., None],
    receive: Callable[[Any], None],
    num_workers: int,
    nbytes: int,
    count: int,
) -> float:
    ctx = mp.get_context("forkserver")
    per_worker = count // num_workers + 1
    queues = [ctx.Queue(maxsize=3) for _ in range(num_workers)]
    procs = [ctx.Process(target=worker, args=(q, nbytes, per_worker), daemon=True) for q in queues]
    for p in procs:
        p.start()
    for q in queues:  # warm up
        receive(q.get())
    start = time.perf_counter()
    for k in range(count):
        receive(queues[k % num_workers].get())
    elapsed = time.perf_counter() - start
    for p in procs:
        p.join()
    return elapsed


def transport_table(total_bytes: int) -> None:
    runs: dict[str, Callable[[int, int, int], float]] = {
        "chute (shared slab)": chute_run,
        "chute (pipes, no shm)": lambda w, n, c: chute_run(w, n, c, shm=0),
        "mp.Queue": lambda w, n, c: baseline_run(queue_worker, lambda a: None, w, n, c),
        "SharedMemory per array": lambda w, n, c: baseline_run(
            segment_worker, segment_receive, w, n, c
        ),
    }
    print(f"\nThroughput, GB/s (median of 3 runs, {total_bytes / 2**30:.1f} GiB each)")
    print(
        f"{'transport':<24}"
        + "".join(f"{h:>14}" for h in ("1 MiB x1", "1 MiB x2", "16 MiB x1", "16 MiB x2"))
    )
    for name, run in runs.items():
        cells = []
        for nbytes in (MiB, 16 * MiB):
            for workers in (1, 2):
                count = max(8, total_bytes // nbytes)
                rates = [count * nbytes / run(workers, nbytes, count) / 1e9 for _ in range(3)]
                cells.append(f"{statistics.median(rates):>14.2f}")
        print(f"{name:<24}" + "".join(cells), flush=True)


def small_task(index: int, count: int, task: int) -> int:
    return task


def first_result(method: str, workers: int) -> tuple[float, float]:
    """Seconds from `WorkerPool(...)` to one result from every worker: first pool, next."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        with WorkerPool(workers, small_task, start_method=method) as pool:
            for w in range(workers):
                pool.put(w, w)
            for w in range(workers):
                pool.get(w)
            times.append(time.perf_counter() - start)
    return times[0], times[1]


def startup_table() -> None:
    print("\nTime to first result from every worker, seconds (fresh interpreter; default")
    print("16 MiB first slab per worker; 'next pool' reuses the forkserver)")
    print(f"{'start method':<14}{'workers':>8}{'first pool':>12}{'next pool':>12}")
    for method in ("fork", "forkserver", "spawn"):
        for workers in (2, 8):
            out = subprocess.run(
                [sys.executable, __file__, "--first-result", method, str(workers)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            print(
                f"{method:<14}{workers:>8}{float(out[0]):>12.3f}{float(out[1]):>12.3f}", flush=True
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="move 1 GiB per cell, not 2")
    parser.add_argument("--first-result", nargs=2, metavar=("METHOD", "WORKERS"))
    args = parser.parse_args()
    if args.first_result:
        print(*first_result(args.first_result[0], int(args.first_result[1])))
        return
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {mp.cpu_count()} cores")
    transport_table((1 if args.quick else 2) << 30)
    startup_table()


if __name__ == "__main__":
    main()
