"""`WorkerPool` with real worker processes: results, order, start methods, misuse."""

from __future__ import annotations

import functools
import threading

import numpy as np
import psutil
import pytest

import mp_helpers
from chute._src.exec.mp import NotPicklableError, PoolClosedError, PoolUsageError, WorkerPool

SHM = 4 << 20  # small slabs keep pool start-up quick


def run_in_order(pool: WorkerPool, tasks: list, buffer_size: int) -> list:
    """Task k goes to worker k % W; results are read back in task order (mp_prefetch's plan)."""
    w = pool.num_workers
    out, put = [], 0
    for k in range(len(tasks)):
        while put < len(tasks) and put < k + w * buffer_size:
            pool.put(put % w, tasks[put])
            put += 1
        out.append(pool.get(k % w, timeout=60))
    return out


@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_each_start_method_runs_tasks_on_the_chosen_worker(start_method: str) -> None:
    with WorkerPool(
        2, mp_helpers.whoami, start_method=start_method, shm_bytes_per_worker=SHM
    ) as pool:
        pool.put(1, "a")
        pool.put(0, "b")
        index, count, task, pid = pool.get(1, timeout=60)
        assert (index, count, task) == (1, 2, "a") and pid == pool.pids[1]
        assert pool.get(0, timeout=60)[:3] == (0, 2, "b")


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_output_does_not_depend_on_the_number_of_workers(num_workers: int) -> None:
    with WorkerPool(
        num_workers, mp_helpers.square_block, buffer_size=3, shm_bytes_per_worker=SHM
    ) as pool:
        got = run_in_order(pool, list(range(40)), buffer_size=3)
    for k, block in enumerate(got):
        np.testing.assert_array_equal(block, mp_helpers.square_block(0, 1, k))


def test_results_are_fifo_per_worker() -> None:
    with WorkerPool(1, mp_helpers.identity, buffer_size=5, shm_bytes_per_worker=SHM) as pool:
        for t in range(5):
            pool.put(0, t)
        assert pool.outstanding(0) == 5
        assert [pool.get(0, timeout=60) for _ in range(5)] == list(range(5))
        assert pool.outstanding(0) == 0


def test_arrays_stay_valid_while_held_across_many_results() -> None:
    nbytes = 1 << 20  # four results fill a slab
    with WorkerPool(2, mp_helpers.filled, buffer_size=2, shm_bytes_per_worker=SHM) as pool:
        tasks = [(float(k), nbytes) for k in range(24)]
        held = run_in_order(pool, tasks, buffer_size=2)  # the consumer keeps everything
        for k, a in enumerate(held):
            assert a.shape == (nbytes // 8,) and (a == k).all()
        del held
        # Once released, later results reuse the slabs.
        assert [a[0] for a in run_in_order(pool, tasks[:8], buffer_size=2)] == list(range(8))


def test_tree_of_arrays_and_objects_comes_back_intact() -> None:
    with WorkerPool(2, mp_helpers.tree, shm_bytes_per_worker=SHM) as pool:
        pool.put(1, 9)
        got = pool.get(1, timeout=60)
    want = mp_helpers.tree(0, 1, 9)
    np.testing.assert_array_equal(got["big"], want["big"])
    np.testing.assert_array_equal(got["strided"], want["strided"])
    assert isinstance(got["example"], mp_helpers.Example) and got["example"].label == 9
    assert isinstance(got["pair"], mp_helpers.Pair)
    got["big"][0, 0] = 42.0  # the consumer owns its arrays: they are writable


def test_result_larger_than_the_slab_still_arrives() -> None:
    with WorkerPool(1, mp_helpers.filled, shm_bytes_per_worker=1 << 20) as pool:
        pool.put(0, (3.0, 8 << 20))
        a = pool.get(0, timeout=60)
    assert a.nbytes == 8 << 20 and (a == 3.0).all()


def test_worker_init_fn_runs_once_per_worker_before_any_task() -> None:
    with WorkerPool(
        3,
        mp_helpers.init_calls,
        worker_init_fn=mp_helpers.record_init,
        buffer_size=2,
        shm_bytes_per_worker=SHM,
    ) as pool:
        for w in range(3):
            pool.put(w, None)
            pool.put(w, None)
        for w in range(3):
            assert pool.get(w, timeout=60) == [(w, 3)]
            assert pool.get(w, timeout=60) == [(w, 3)]


def test_start_is_idempotent_and_starts_every_worker() -> None:
    pool = WorkerPool(2, mp_helpers.identity, shm_bytes_per_worker=SHM)
    pool.start()
    pids = pool.pids
    pool.start()
    assert pool.pids == pids and len(pids) == 2
    assert all(psutil.pid_exists(p) for p in pids)
    pool.close()
    pool.close()
    assert pool.closed


def test_unpicklable_worker_fn_is_refused_before_any_process_starts() -> None:
    before = psutil.Process().children(recursive=True)
    lock = threading.Lock()
    with pytest.raises(NotPicklableError, match=r"worker_fn .*lambda.* cannot be pickled.*locks"):
        WorkerPool(2, lambda i, n, t: (lock, t))
    with pytest.raises(NotPicklableError, match=r"worker_init_fn .* cannot be pickled"):
        WorkerPool(2, mp_helpers.identity, worker_init_fn=lambda i, n: print(lock))
    assert psutil.Process().children(recursive=True) == before


def test_a_lambda_reaches_the_workers_by_value() -> None:
    offset = 5

    def add(index: int, count: int, task: int) -> int:
        return task + offset

    pool: WorkerPool[int, int]
    with WorkerPool(1, add, shm_bytes_per_worker=SHM) as pool:
        pool.put(0, 1)
        assert pool.get(0, timeout=60) == 6


def test_partial_of_a_module_level_function_is_accepted() -> None:
    fn = functools.partial(mp_helpers.identity)
    with WorkerPool(1, fn, shm_bytes_per_worker=SHM) as pool:
        pool.put(0, "x")
        assert pool.get(0, timeout=60) == "x"


def test_misuse_gives_errors_that_name_the_fix() -> None:
    with WorkerPool(2, mp_helpers.identity, buffer_size=1, shm_bytes_per_worker=SHM) as pool:
        with pytest.raises(
            PoolUsageError, match=r"worker 0 has no task outstanding.*put\(0, task\)"
        ):
            pool.get(0)
        pool.put(0, 1)
        with pytest.raises(PoolUsageError, match=r"already has 1 tasks outstanding.*buffer_size=1"):
            pool.put(0, 2)
        with pytest.raises(IndexError, match=r"worker_index=2 is out of range .* \(0 to 1\)"):
            pool.put(2, 1)
        with pytest.raises(NotPicklableError, match=r"task .* cannot be pickled.* worker 1"):
            pool.put(1, lambda: None)
        assert pool.get(0, timeout=60) == 1
    with pytest.raises(PoolClosedError, match="create a new WorkerPool"):
        pool.put(0, 1)
    with pytest.raises(ValueError, match="num_workers=0 must be at least 1"):
        WorkerPool(0, mp_helpers.identity)
    with pytest.raises(ValueError, match="start_method='threads' is not one of"):
        WorkerPool(1, mp_helpers.identity, start_method="threads")


def test_get_times_out_and_the_pool_stays_usable() -> None:
    with WorkerPool(1, mp_helpers.sleep, shm_bytes_per_worker=SHM) as pool:
        pool.put(0, 0.5)
        with pytest.raises(TimeoutError, match="Call `get` again"):
            pool.get(0, timeout=0.01)
        assert pool.get(0, timeout=60) == 0.5


def test_default_slab_grows_to_fit_large_results() -> None:
    with WorkerPool(1, mp_helpers.filled, buffer_size=2) as pool:
        first = pool.slab_bytes(0)
        held = []
        for k in range(6):
            pool.put(0, (float(k), 8 << 20))
            held.append(pool.get(0, timeout=60))
        assert pool.slab_bytes(0) >= 4 * (8 << 20) > first
        assert [a[0] for a in held] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_workers_keep_per_element_arrays_on_the_heap() -> None:
    # glibc mmaps (and faults in afresh, every time) each block above its threshold,
    # 128 KiB in a fresh process; the worker raises it, so a 4 MiB array comes from
    # reusable heap memory.
    with WorkerPool(1, mp_helpers.mmapped_blocks_holding, shm_bytes_per_worker=SHM) as pool:
        pool.put(0, 4 << 20)
        assert pool.get(0, timeout=60) == 0
