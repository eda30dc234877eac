"""Neither the forkserver nor a worker runs the main script: its top level runs once, in
the user's process, with or without an `if __name__ == "__main__":` guard (more cases, as
users write them, in test_worker_scripts.py). Each case runs a real script in a fresh
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from process_helpers import SRC, run_python

# The script's top level says where it runs: the main process, the forkserver, or a worker
# (`chute-worker-...`), and the pipeline uses a function the script defines.
SCRIPT = """
import multiprocessing, os, sys
import chute

# One write (atomic on a pipe): the processes' lines do not interleave.
os.write(2, f"top level: {{multiprocessing.current_process().name}} {{os.getpid()}}\\n".encode())
{extra}

def tag(x):
    return x, os.getpid()

if __name__ == "__main__":
    ds = chute.MapDataset.range(12).map(tag).to_iter_dataset()
    for _ in range(2):
        out = list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
        assert [x for x, _ in out] == list(range(12))
        print("workers:", sorted({{pid for _, pid in out}} - {{os.getpid()}}))
"""


def run(folder: Path, extra: str = "", module: bool = False) -> tuple[list[str], list[str]]:
    """Runs the script (as a file, or with `python -m`); returns the processes that ran
    its top level and the lines naming the workers."""
    (folder / "job.py").write_text(SCRIPT.format(extra=textwrap.dedent(extra)))
    args = ["-m", "job"] if module else [str(folder / "job.py")]
    done = run_python(folder, args, cwd=folder)
    tops = [line.split()[2] for line in done.stderr.splitlines() if line.startswith("top level:")]
    return tops, [line for line in done.stdout.splitlines() if line.startswith("workers:")]


def test_workers_never_run_the_main_script(tmp_path: Path) -> None:
    tops, workers = run(tmp_path)
    assert len(workers) == 2  # two pools of two workers, which computed elements
    assert tops == ["MainProcess"], tops  # this process alone: not the forkserver, no worker


def test_a_script_run_as_a_module_is_not_imported_by_workers(tmp_path: Path) -> None:
    tops, workers = run(tmp_path, module=True)
    assert len(workers) == 2
    assert tops == ["MainProcess"], tops


def test_a_script_that_would_fail_outside_the_main_process_is_never_tried(
    tmp_path: Path,
) -> None:
    extra = """
    if multiprocessing.current_process().name != "MainProcess" or __name__ != "__main__":
        raise RuntimeError("run outside the main process")
    """
    tops, workers = run(tmp_path, extra)
    assert len(workers) == 2
    assert tops == ["MainProcess"], tops


def test_importing_the_server_init_elsewhere_does_nothing(tmp_path: Path) -> None:
    """Only the forkserver acts on `_server_init` (a process started with another command
    line that imports it sets no variable and imports nothing)."""
    code = (
        "import os, sys; import chute._src.exec.mp._server_init; "
        "print([os.environ.get(n) for n in ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS')], "
        "'numpy' in sys.modules)"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONPATH": SRC},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[None, None] False"
