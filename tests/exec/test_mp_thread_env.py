"""Workers run native thread pools (OpenBLAS, OpenMP, MKL) with one thread each, unless the
user's environment says otherwise, and the user's own process keeps its environment. Each
case runs a real script in a fresh interpreter, so that the forkserver starts there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from process_helpers import run_python

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)"
)

NAMES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

SCRIPT = """
import json, os
import numpy as np
import chute
from chute._src.exec.mp import WorkerPool

NAMES = {names!r}


def probe():
    # A matrix product starts numpy's BLAS thread pool if it has more than one thread.
    before = len(os.listdir("/proc/self/task"))
    a = np.ones((512, 512))
    float((a @ a).sum())
    started = len(os.listdir("/proc/self/task")) - before
    return os.getpid(), [os.environ.get(n) for n in NAMES], started


def element(i):
    return probe()


def task(worker_index, num_workers, x):
    return probe()


if __name__ == "__main__":
    ds = chute.MapDataset.range(16).map(element).to_iter_dataset()
    opts = chute.MultiprocessingOptions(num_workers=2)
    # The second pool: the consumer computes more than the first element only while the
    # program's first pool waits for the forkserver to start.
    list(ds.mp_prefetch(opts))
    out = list(ds.mp_prefetch(opts))
    forkserver = [o[1:] for o in out if o[0] != os.getpid()]
    with WorkerPool(1, task, start_method="spawn") as pool:
        pool.put(0, 0)
        spawn = pool.get(0, timeout=120)[1:]
    parent = [os.environ.get(n) for n in NAMES]
    print(json.dumps({{"forkserver": forkserver, "spawn": spawn, "parent": parent}}))
"""


def run(folder: Path, env: dict[str, str]) -> dict[str, list]:
    (folder / "job.py").write_text(SCRIPT.format(names=NAMES))
    base = {k: v for k, v in os.environ.items() if k not in NAMES}
    done = run_python(folder, [str(folder / "job.py")], env={**base, **env}, cwd=folder)
    return json.loads(done.stdout.splitlines()[-1])


def test_workers_run_one_native_thread_each_and_the_parent_keeps_its_environment(
    tmp_path: Path,
) -> None:
    out = run(tmp_path, {})
    assert out["forkserver"], "no element was computed by a worker"
    for values, started in out["forkserver"]:
        assert values == ["1", "1", "1"]
        assert started == 0  # numpy's BLAS started no threads in the worker
    assert out["spawn"] == [["1", "1", "1"], 0]
    assert out["parent"] == [None, None, None]  # nothing set in the user's process


def test_a_thread_count_the_user_set_reaches_the_workers(tmp_path: Path) -> None:
    out = run(tmp_path, {"OMP_NUM_THREADS": "3"})
    assert out["forkserver"]
    for values, _ in out["forkserver"]:
        assert values == ["1", "3", "1"]
    assert out["spawn"][0] == ["1", "3", "1"]
    assert out["parent"] == [None, "3", None]


def test_a_value_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # The defaults are applied in the server's and the workers' own environment, never in
    # the user's process; a variable the user set is left as it is.
    from chute._src.exec.mp._server_init import WORKER_THREAD_ENV, apply_thread_defaults

    for name in WORKER_THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    apply_thread_defaults()
    assert [os.environ.get(n) for n in WORKER_THREAD_ENV] == ["1", "4", "1"]
