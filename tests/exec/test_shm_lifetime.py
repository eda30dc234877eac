"""Shared memory cannot outlive its owner: after `kill -9` of the main process or of a
worker, at any moment, nothing of chute's stays in `/dev/shm`; and the names older
versions left there are swept, while files that live processes hold are kept.

The main process is a real interpreter (a script run with `subprocess`) that this test
kills. Other runs of chute may share this machine's `/dev/shm`, so the check counts only
the names carrying the pid of a process the test started (chute named its files
`chute_<pid>_...`, `chute_cache_<pid>_...`, `chute_list_<pid>_...`).
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import chute
import mp_helpers
import mp_pipelines as mpp
import shm_helpers
from chute._src.core import shm_files
from chute._src.exec.mp import WorkerPool
from chute._src.storage.formats.shared_list import SharedListSource

SRC = str(Path(chute.__file__).resolve().parents[1])

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/dev/shm") or not os.path.isdir("/proc"), reason="Linux /dev/shm"
)

# Loops over epochs until killed, a new iterator (so new workers) per epoch. "cached":
# MapDataset.cache() under 2 workers (the cache's shared store, the slabs); "streamed": a
# large list read as a stream by 2 workers (the list's shared file, slabs that grow).
SCRIPT = textwrap.dedent(
    """
    import sys

    import numpy as np

    import chute


    def small(x):
        return {"x": np.full(4096, x, np.float32)}  # 16 KiB: results through the slab


    def large(pair):
        return {"x": np.full(1 << 16, pair[0], np.float32), "s": pair[1]}  # 256 KiB


    if __name__ == "__main__":
        options = chute.MultiprocessingOptions(num_workers=2)
        if sys.argv[1] == "cached":
            ds = chute.MapDataset.range(600).map(small).cache()
            make = lambda: ds.to_iter_dataset().batch(4).mp_prefetch(options)
        else:
            data = [(i, "r" * 100) for i in range(12_000)]  # shared, not pickled per worker
            make = lambda: (
                chute.MapDataset.source(data)[:1_200].map(large).to_iter_dataset()
                .batch(32).mp_prefetch(options)
            )
        epoch = 0
        while True:
            for step, _ in enumerate(make()):
                if epoch == 0 and step == 0:
                    print("running", flush=True)
            epoch += 1
    """
)


def _start(folder: Path, mode: str) -> subprocess.Popen[str]:
    script = folder / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _tree(main: int) -> tuple[set[int], list[int]]:
    """Every process of the run now (the main process, its forkserver and resource
    tracker, the workers), and the workers (the processes whose parent is not `main`)."""
    try:
        children = psutil.Process(main).children(recursive=True)
    except psutil.NoSuchProcess:
        return set(), []
    workers = []
    for p in children:
        try:
            if p.ppid() != main:
                workers.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return {main, *(p.pid for p in children)}, workers


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for_line(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    got = proc.stdout.readline()
    assert got == line + "\n", f"the run printed {got!r}, not {line!r} (exit {proc.poll()})"


def _sleep_watching(main: int, seconds: float, seen: set[int]) -> None:
    """Sleeps `seconds`, recording every process of the run met meanwhile in `seen`."""
    end = time.monotonic() + seconds
    while True:
        seen |= _tree(main)[0]
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.02, left))


def _kill_once(folder: Path, mode: str, target: str, rng: random.Random) -> tuple[set[int], str]:
    """One run of `mode`, `target` ("main" or "worker") killed with SIGKILL at a random
    moment; waits until every process of the run is gone. Returns their pids and when the
    kill landed."""
    proc = _start(folder, mode)
    seen = {proc.pid}
    try:
        if target == "main" and rng.random() < 0.5:
            when = "during start-up"  # importing, building, making the store, starting workers
            _sleep_watching(proc.pid, rng.uniform(0.0, 6.0), seen)
            victim = proc.pid
        else:
            _wait_for_line(proc, "running")
            _sleep_watching(proc.pid, rng.uniform(0.0, 1.5), seen)
            when = "while running"
            victim = proc.pid
        while True:
            if target == "worker":
                while not (workers := _tree(proc.pid)[1]):  # between two epochs' pools
                    assert proc.poll() is None, "the run ended by itself"
                    _sleep_watching(proc.pid, 0.01, seen)
                victim = rng.choice(workers)
            seen |= _tree(proc.pid)[0]
            try:
                os.kill(victim, signal.SIGKILL)
                break
            except ProcessLookupError:  # a worker whose pool was just closed: another
                continue
        if victim != proc.pid:
            try:  # a killed worker makes the main process raise WorkerDiedError and exit
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # it was stopping: its pool did not need it
                when += ", the run went on until killed"
                seen |= _tree(proc.pid)[0]
                proc.kill()
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()
    deadline = time.monotonic() + 60
    while (left := [p for p in seen if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], f"processes of the run still alive after {mode}/{target} ({when}): {left}"
    return seen, when


@pytest.mark.slow
def test_kill_9_of_the_main_process_or_a_worker_leaves_nothing_in_dev_shm(
    tmp_path: Path,
) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    plan = [(mode, target) for mode in ("cached", "streamed") for target in ("main", "worker")]
    kills = []
    for i in range(20):  # 5 of each
        mode, target = plan[i % len(plan)]
        pids, when = _kill_once(tmp_path, mode, target, rng)
        left = shm_helpers.chute_names(pids)
        assert not left, f"kill -9 of the {target} ({mode} run, {when}; seed {seed}) left {left}"
        kills.append((mode, target, when))
    assert sum(when == "while running" for _, _, when in kills) >= 10


HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)  # as chute's cache and list files were held
    os.utime(sys.argv[1], (0, 0))  # as old as can be: only the lock keeps it
    print("holding", flush=True)
    sys.stdin.read()
    os.unlink(sys.argv[1])
    """
)


def test_names_left_by_earlier_versions_are_swept_when_workers_start() -> None:
    """Files of chute's old names whose makers are gone go when a pool starts; a file a
    live process holds stays, whatever pid its name carries (here this very process's, as
    when a pid is reused); so do a file in creation (young) and files of other names.

    In a folder of its own on the tmpfs (the pool's `shm_dir`): other runs of chute on
    this machine sweep `/dev/shm` itself."""
    shm = Path(tempfile.mkdtemp(prefix="chute-sweep-test-", dir="/dev/shm"))
    tag = os.urandom(6).hex()
    stale = [
        shm / f"chute_cache_999999991_{tag}",
        shm / f"chute_list_999999992_{tag}",
        shm / f"chute_999999993_{tag}",  # a slab's name, left between create and unlink
    ]
    held = shm / f"chute_cache_{os.getpid()}_{tag}"
    young = shm / f"chute_list_999999994_{tag}"
    others = [shm / f"chute-x_999999995_{tag}", shm / f"psm_{tag}", shm / f"chute_cache_{tag}"]
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(held)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        for path in [*stale, *others]:
            path.write_bytes(b"left behind")
            os.utime(path, (0, 0))
        young.write_bytes(b"just made")
        with WorkerPool(1, mp_helpers.identity, shm_dir=str(shm)) as pool:
            pool.put(0, 7)
            assert pool.get(0, timeout=60) == 7
        assert [p.name for p in stale if p.exists()] == []
        assert held.exists() and young.exists()
        assert all(p.exists() for p in others)
    finally:
        holder.communicate("", timeout=30)
        for path in [*stale, young, *others]:
            path.unlink(missing_ok=True)
        left = sorted(p.name for p in shm.iterdir())
        shutil.rmtree(shm, ignore_errors=True)
    assert left == []  # the holder removed its file; the slabs had no name


@pytest.mark.parametrize("start_method", ["forkserver", "spawn", "fork"])
def test_shared_files_reach_workers_by_descriptor_with_every_start_method(
    start_method: str,
) -> None:
    data = [(i, f"row {i}") for i in range(12_000)]
    shared = SharedListSource(data)
    try:
        with shm_files.handing_over() as handed:
            payload = pickle.dumps(shared.__getitems__)
        assert len(handed.fds) == 1
        pool = WorkerPool(
            2, shm_helpers.Unpickled(payload), start_method=start_method, handed_fds=handed.fds
        )
        with pool:
            for w, rows in enumerate([[0, 5], [11_999, 7]]):
                pool.put(w, rows)
            assert pool.get(0, timeout=60) == [data[0], data[5]]
            assert pool.get(1, timeout=60) == [data[11_999], data[7]]
            assert not shm_helpers.chute_names({os.getpid(), *pool.pids})
    finally:
        shared.unlink()


def test_a_shared_list_pickled_without_its_descriptor_says_so() -> None:
    shared = SharedListSource(list(range(10_000)))
    try:
        payload = pickle.dumps(shared)  # not under handing_over(): nothing goes with it
        with pytest.raises(
            RuntimeError,
            match=r"reached a process it was not handed to.*"
            r"Pickle the original list",
        ):
            pickle.loads(payload)
    finally:
        shared.unlink()


def test_a_cache_pickled_without_its_descriptor_starts_empty(tmp_path: Path) -> None:
    """A copy of a dataset whose cache is shared with workers (sent to a Ray actor, say)
    gets a cache of its own: the same elements, computed again."""
    ds = chute.MapDataset.range(50).map(mpp.double).cache()
    options = chute.MultiprocessingOptions(num_workers=2)
    assert list(ds.to_iter_dataset().mp_prefetch(options)) == [2 * i for i in range(50)]
    assert ds.held[0] == 50
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.held == (0, 0)
    assert list(copy) == [2 * i for i in range(50)] and copy.held[0] == 50
    assert ds.held[0] == 50
