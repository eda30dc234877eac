"""The forkserver imports, once, the modules workers unpickle their tasks with (chute's
stages, the user's functions), so that each worker does not import them again; a module
that cannot be imported there is left to the workers, as before. The cases with processes
run a real script in a fresh interpreter, where the forkserver starts."""

from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path

import numpy as np

import chute
import mp_pipelines as mpp
from chute._src.exec.workers import pipeline_pickle
from chute._src.exec.workers.service import worker_modules as _worker_modules
from process_helpers import run_python

# A module of the user's: its top level says which process imports it.
STAGES = """
import multiprocessing, os
os.write(2, f"stages: {{multiprocessing.current_process().name}}\\n".encode())
{extra}

def tag(x):
    return x, os.getpid()

def init(index, count):
    pass
"""

SCRIPT = """
import os
import chute

if __name__ == "__main__":
    import stages  # imported here only: the forkserver does not get it from the script

    ds = chute.MapDataset.range(12).map(stages.tag).to_iter_dataset()
    options = chute.MultiprocessingOptions(num_workers=2)
    out = list(ds.mp_prefetch(options, worker_init_fn={init}))
    assert [x for x, _ in out] == list(range(12))
    print("workers:", sorted({{pid for _, pid in out}} - {{os.getpid()}}))
"""


def importers(folder: Path, extra: str = "", init: str = "None") -> list[str]:
    """Runs the script; returns the processes that imported `stages`, in order."""
    (folder / "stages.py").write_text(STAGES.format(extra=textwrap.dedent(extra)))
    (folder / "job.py").write_text(SCRIPT.format(init=init))
    done = run_python(folder, [str(folder / "job.py")], cwd=folder)
    assert [line for line in done.stdout.splitlines() if line.startswith("workers: [")]
    return [line.split()[1] for line in done.stderr.splitlines() if line.startswith("stages:")]


def test_the_forkserver_imports_the_users_modules_once_for_all_workers(tmp_path: Path) -> None:
    # This process, then the forkserver; neither worker imports it again.
    assert importers(tmp_path) == ["MainProcess", "MainProcess"]


def test_with_a_worker_init_fn_each_worker_imports_the_users_modules(tmp_path: Path) -> None:
    # They may depend on what worker_init_fn sets up, so they come after it, as before.
    got = importers(tmp_path, init="stages.init")
    assert got[0] == "MainProcess" and len(got) == 3, got
    assert all(name.startswith("chute-worker-") for name in got[1:]), got


def test_a_module_that_fails_in_the_forkserver_is_imported_by_each_worker(
    tmp_path: Path,
) -> None:
    extra = """
    import sys
    forkserver = "multiprocessing.forkserver import main" in " ".join(sys.orig_argv)
    if forkserver and multiprocessing.current_process().name == "MainProcess":
        raise RuntimeError("only in the forkserver")  # (workers inherit its argv)
    """
    got = importers(tmp_path, extra)
    assert got[:2] == ["MainProcess", "MainProcess"] and len(got) == 4, got
    assert all(name.startswith("chute-worker-") for name in got[2:]), got


def test_the_server_imports_each_module_it_is_handed_and_survives_failures(
    tmp_path: Path,
) -> None:
    (tmp_path / "raises.py").write_text("raise RuntimeError('at import')\n")
    (tmp_path / "exits.py").write_text("raise SystemExit(3)\n")
    from chute._src.exec.mp._server_init import MODULE_PREFIX

    modules = ["raises", "json", "no_such_module", "exits", "chute._src.ops.map"]
    entries = [MODULE_PREFIX + m for m in modules]
    # A process whose command line is the forkserver's (what _server_init looks for), with
    # the modules in its preload list.
    code = (
        f"'from multiprocessing.forkserver import main'; {entries!r}; import sys; "
        "import chute._src.exec.mp._server_init; "
        "print(sorted(m for m in ('raises', 'json', 'exits', 'chute._src.ops.map') "
        "if m in sys.modules))"
    )
    done = run_python(tmp_path, ["-c", code])
    assert done.stdout.split("\n")[0] == "['chute._src.ops.map', 'json']"


def test_worker_modules_name_the_stages_and_the_users_functions() -> None:
    ds = chute.MapDataset.range(8).shuffle(seed=1).map(mpp.double).batch(2).to_iter_dataset()
    names = _worker_modules(ds, users_too=True)
    assert names[0] == "chute._src.exec.workers.worker"  # the function workers run
    for module in ("chute._src.ops.shuffle", "chute._src.ops.map", "chute._src.ops.batch"):
        assert module in names, names
    assert "mp_pipelines" in names
    assert "mp_pipelines" not in _worker_modules(ds, users_too=False)


def test_referenced_modules_stop_at_the_budget_and_at_what_cannot_be_pickled() -> None:
    # The stages come before the source's data, which is cut short by the budget.
    big = chute.MapDataset.source(list(range(2_000_000))).map(mpp.double)
    names = pipeline_pickle.referenced_modules(big, budget_bytes=64 << 10)
    assert "chute._src.ops.map" in names and "chute._src.ops.source" in names, names
    # A lock cannot be pickled: what came before it is named, and nothing is raised.
    held = chute.MapDataset.source([threading.Lock()]).map(repr)
    assert "chute._src.ops.map" in pipeline_pickle.referenced_modules(held)
    # Modules referred to as such (cloudpickle refers to `np` in a lambda that way).
    assert "numpy" in pipeline_pickle.referenced_modules(lambda x: np.sqrt(x))
    assert "__main__" not in pipeline_pickle.referenced_modules([mpp.double])


RANDOM_STAGES = """
import sys

LOADED = None


def init(index, count):  # runs in a worker before it unpickles the pipeline
    global LOADED
    LOADED = "numpy.random" in sys.modules


def jitter(x, rng):
    return x, LOADED
"""

RANDOM_SCRIPT = """
import json
import chute
import random_stages

if __name__ == "__main__":
    ds = chute.MapDataset.range(8).random_map(random_stages.jitter, seed=1).to_iter_dataset()
    options = chute.MultiprocessingOptions(num_workers=2)
    print(json.dumps(list(ds.mp_prefetch(options, worker_init_fn=random_stages.init))))
"""


def test_workers_of_a_random_map_find_numpy_random_loaded_by_the_forkserver(
    tmp_path: Path,
) -> None:
    # `import numpy` leaves numpy.random out (~20 ms to import); the random_map stage's
    # module imports it, so the server has it before it forks any worker.
    (tmp_path / "random_stages.py").write_text(RANDOM_STAGES)
    (tmp_path / "job.py").write_text(RANDOM_SCRIPT)
    done = run_python(tmp_path, [str(tmp_path / "job.py")], cwd=tmp_path)
    out = json.loads(done.stdout.splitlines()[-1])
    assert [x for x, _ in out] == list(range(8))
    # Element 0 is computed in the main process (no worker_init_fn ran there).
    assert [loaded for _, loaded in out[1:]] == [True] * 7, out
