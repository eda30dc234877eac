"""Failures and shutdown of `WorkerPool`, with real processes and real signals."""

from __future__ import annotations

import gc
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import mp_helpers
from chute._src.exec.mp import (
    PoolClosedError,
    RemoteTraceback,
    SharedMemoryWarning,
    WorkerDiedError,
    WorkerError,
    WorkerPool,
)

TESTS = Path(__file__).resolve().parents[1]  # the helpers shared by every folder
SHM = 4 << 20


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_gone(pids: list[int], seconds: float = 20.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def our_shm_entries() -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("chute_"))


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if alive(p.pid)}


@pytest.fixture
def no_leaks():
    """Asserts a test leaves no processes, threads or /dev/shm entries behind.

    multiprocessing's own helpers (the forkserver and the resource tracker, shared by
    every pool and ended at interpreter exit) are started first, so they are not counted.
    """
    with WorkerPool(1, mp_helpers.identity, shm_bytes_per_worker=SHM) as warm:
        warm.put(0, 0)
        warm.get(0, timeout=60)
    before = (descendants(), threading.active_count(), our_shm_entries())
    yield
    gc.collect()
    assert wait_until_gone(list(descendants() - before[0]), 10.0) == []
    assert (threading.active_count(), our_shm_entries()) == before[1:]


def test_worker_exception_keeps_its_type_and_remote_traceback(no_leaks) -> None:
    pool = WorkerPool(2, mp_helpers.fail_on, buffer_size=4, shm_bytes_per_worker=SHM)
    for t in range(4):
        pool.put(t % 2, t)
    assert pool.get(0, timeout=60) == 0
    assert pool.get(1, timeout=60) == 1
    assert pool.get(0, timeout=60) == 2
    with pytest.raises(mp_helpers.CustomError, match="bad task 3") as info:
        pool.get(1, timeout=60)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fail_on" in cause.tb and "raise CustomError" in cause.tb
    assert info.value.__notes__ == [
        "chute: raised in worker 1 of 2 while running worker_fn on task 3"
    ]
    assert pool.closed
    with pytest.raises(PoolClosedError, match="because worker 1 raised CustomError"):
        pool.put(0, 5)


def test_exception_that_cannot_be_unpickled_becomes_worker_error(no_leaks) -> None:
    with WorkerPool(1, mp_helpers.fail_unpicklable, shm_bytes_per_worker=SHM) as pool:
        pool.put(0, 5)
        with pytest.raises(WorkerError, match=r"UnpicklableError: 5/0") as info:
            pool.get(0, timeout=60)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "in fail_unpicklable" in info.value.__cause__.tb


def test_result_that_cannot_be_pickled_is_reported(no_leaks) -> None:
    with WorkerPool(1, mp_helpers.return_lambda, shm_bytes_per_worker=SHM) as pool:
        pool.put(0, 1)
        with pytest.raises(Exception, match="pickle") as info:
            pool.get(0, timeout=60)
    assert any("could not pickle the result" in n for n in info.value.__notes__)


def test_worker_init_fn_failure_surfaces_in_get(no_leaks) -> None:
    pool = WorkerPool(
        2, mp_helpers.identity, worker_init_fn=mp_helpers.failing_init, shm_bytes_per_worker=SHM
    )
    pool.put(1, "x")
    with pytest.raises(RuntimeError, match="cannot initialise worker 1") as info:
        pool.get(1, timeout=60)
    assert info.value.__notes__ == [
        "chute: raised in worker 1 of 2 in worker_init_fn (or unpickling worker_fn)"
    ]
    assert pool.closed


def test_worker_killed_with_sigkill_is_reported_not_awaited(no_leaks) -> None:
    pool = WorkerPool(2, mp_helpers.sleep, shm_bytes_per_worker=SHM)
    pool.put(1, 30.0)
    victim = pool.pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(
        WorkerDiedError,
        match=rf"worker 1 of 2 \(pid {victim}\) was killed by SIGKILL.*oldest being 30.0",
    ) as info:
        pool.get(1, timeout=60)
    assert info.value.worker_index == 1 and info.value.exitcode == -signal.SIGKILL
    assert pool.closed


def test_worker_that_kills_itself_mid_task_is_reported(no_leaks) -> None:
    with WorkerPool(1, mp_helpers.die, buffer_size=2, shm_bytes_per_worker=SHM) as pool:
        pool.put(0, 0)
        pool.put(0, 1)
        assert pool.get(0, timeout=60) == 0
        with pytest.raises(WorkerDiedError, match=r"killed by SIGKILL.*out-of-memory"):
            pool.get(0, timeout=60)


def test_workers_ignore_sigint(no_leaks) -> None:
    with WorkerPool(2, mp_helpers.identity, shm_bytes_per_worker=SHM) as pool:
        for w in range(2):  # the workers are up and running tasks
            pool.put(w, w)
            assert pool.get(w, timeout=60) == w
        for pid in pool.pids:
            os.kill(pid, signal.SIGINT)
        for w in range(2):
            pool.put(w, w)
            assert pool.get(w, timeout=60) == w


def test_close_releases_everything_and_arrays_outlive_the_pool(no_leaks) -> None:
    pool = WorkerPool(2, mp_helpers.filled, shm_bytes_per_worker=SHM)
    pool.put(0, (7.0, 1 << 20))
    kept = pool.get(0, timeout=60)
    pids = pool.pids
    pool.close()
    assert wait_until_gone(pids) == []
    assert (kept == 7.0).all()  # the slab lives as long as arrays on it


def test_garbage_collected_pool_stops_its_workers(no_leaks) -> None:
    pool = WorkerPool(2, mp_helpers.identity, shm_bytes_per_worker=SHM)
    pool.put(0, 1)
    pids = pool.pids
    del pool
    gc.collect()
    assert wait_until_gone(pids) == []


def test_exception_in_the_consumer_closes_the_pool(no_leaks) -> None:
    with (
        pytest.raises(KeyError),
        WorkerPool(2, mp_helpers.identity, shm_bytes_per_worker=SHM) as pool,
    ):
        pool.put(0, 1)
        pool.put(1, 2)
        raise KeyError("consumer failed")
    assert pool.closed


def test_explicit_shm_request_too_large_falls_back_to_pipes_with_a_warning(no_leaks) -> None:
    pool = WorkerPool(2, mp_helpers.filled, shm_bytes_per_worker=1 << 40)
    with pytest.warns(SharedMemoryWarning, match=r"do not fit .*--shm-size"):
        pool.start()
    with pool:
        assert pool.shm_bytes_per_worker == 0
        pool.put(1, (2.0, 1 << 20))
        assert (pool.get(1, timeout=60) == 2.0).all()


def test_failure_to_reserve_shm_falls_back_to_pipes_with_a_warning(no_leaks) -> None:
    # posix_fallocate fails like on a full tmpfs: the file-size limit makes it EFBIG.
    pool = WorkerPool(1, mp_helpers.filled, shm_bytes_per_worker=SHM)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, old_limit[1]))
    try:
        with pytest.warns(SharedMemoryWarning, match=r"cannot reserve 1 x 4.0 MiB .*--shm-size"):
            pool.start()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    with pool:
        assert pool.shm_bytes_per_worker == 0
        pool.put(0, (5.0, 2 << 20))
        assert (pool.get(0, timeout=60) == 5.0).all()


def run_script(body: str, **kwargs: object) -> subprocess.Popen[str]:
    script = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {str(TESTS)!r})
        import mp_helpers
        from chute._src.exec.mp import WorkerPool
        """
    ) + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )


def test_interpreter_exit_without_close_leaves_nothing_behind() -> None:
    before = our_shm_entries()
    proc = run_script(
        """
        import psutil
        pool = WorkerPool(2, mp_helpers.filled)
        pool.put(0, (1.0, 4 << 20))
        kept = pool.get(0, timeout=60)
        pool.put(1, (2.0, 1 << 20))  # left outstanding
        print(*[p.pid for p in psutil.Process().children(recursive=True)], flush=True)
        """
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    pids = [int(p) for p in out.split()]
    assert len(pids) >= 2  # the workers (and multiprocessing's helpers)
    assert wait_until_gone(pids) == []
    assert "leaked" not in err and "Traceback" not in err, err
    assert our_shm_entries() == before


def test_ctrl_c_in_the_main_process_stops_the_workers() -> None:
    proc = run_script(
        """
        import psutil, signal
        # As in an interactive program, whatever ignored SIGINT in the test's launcher
        # (a background job of a shell does): Ctrl-C raises KeyboardInterrupt here.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with WorkerPool(2, mp_helpers.sleep) as pool:
            for w in range(2):  # running: the interrupt lands in the loop, not in start-up
                pool.put(w, 0.0)
                pool.get(w)
            print(*[p.pid for p in psutil.Process().children(recursive=True)], flush=True)
            while True:
                for w in range(2):
                    pool.put(w, 0.01)
                for w in range(2):
                    pool.get(w)
        """,
        start_new_session=True,
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C: the whole process group
    _, err = proc.communicate(timeout=60)
    assert "KeyboardInterrupt" in err
    assert err.count("Traceback") == 1, err  # the main process's only: workers ignore it
    assert wait_until_gone(pids) == []


def test_workers_die_when_the_main_process_is_killed() -> None:
    before = our_shm_entries()
    proc = run_script(
        """
        pool = WorkerPool(2, mp_helpers.sleep)
        pool.put(0, 30.0)
        print(*pool.pids, flush=True)
        time.sleep(60)
        """
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    proc.kill()
    proc.communicate(timeout=60)
    assert wait_until_gone(pids) == []
    assert our_shm_entries() == before


def test_pool_results_match_in_process_results_under_every_start_method() -> None:
    want = [mp_helpers.tree(0, 1, k)["big"] for k in range(4)]
    for method in ("fork", "spawn"):
        with WorkerPool(2, mp_helpers.tree, start_method=method, shm_bytes_per_worker=SHM) as pool:
            for k in range(4):
                pool.put(k % 2, k)
                np.testing.assert_array_equal(pool.get(k % 2, timeout=60)["big"], want[k])


def test_worker_that_cannot_grow_its_slab_warns_and_keeps_going(no_leaks) -> None:
    with WorkerPool(1, mp_helpers.filled, worker_init_fn=mp_helpers.limit_file_size) as pool:
        pool.put(0, (1.0, 8 << 20))
        pool.put(0, (2.0, 8 << 20))
        # The first result fits the first slab: it is sent, then the worker tries to grow.
        with pytest.warns(SharedMemoryWarning, match=r"could not grow .*--shm-size"):
            a = pool.get(0, timeout=60)
            b = pool.get(0, timeout=60)
        assert (a == 1.0).all() and (b == 2.0).all()
        pool.put(0, (3.0, 8 << 20))
        assert (pool.get(0, timeout=60) == 3.0).all()
