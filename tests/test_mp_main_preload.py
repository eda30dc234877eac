"""The forkserver runs the main script once, so that workers do not each run it again; a
script that cannot be run there (it raises, or has no `__main__` guard) is left to the
workers, as before. Each case runs a real script in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
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


def test_workers_find_the_main_script_imported_by_the_forkserver(tmp_path: Path) -> None:
    tops, workers = run(tmp_path)
    assert len(workers) == 2  # two pools of two workers, which computed elements
    assert tops == ["MainProcess", "MainProcess"], tops  # this process, then the forkserver


def test_a_script_run_as_a_module_is_imported_once_by_the_forkserver(tmp_path: Path) -> None:
    tops, workers = run(tmp_path, module=True)
    assert len(workers) == 2
    assert tops == ["MainProcess", "MainProcess"], tops


def test_a_script_that_fails_in_the_forkserver_is_run_by_each_worker(tmp_path: Path) -> None:
    extra = """
    if __name__ == "__mp_main__" and multiprocessing.current_process().name == "MainProcess":
        raise RuntimeError("only in the forkserver")
    """
    tops, workers = run(tmp_path, extra)
    assert len(workers) == 2
    # This process, the forkserver (which raised), then each of the 4 workers.
    assert tops[:2] == ["MainProcess", "MainProcess"], tops
    assert len(tops) == 6 and all(t.startswith("chute-worker-") for t in tops[2:]), tops


def test_only_the_forkserver_runs_the_script_it_was_handed(tmp_path: Path) -> None:
    """A process that inherits the variable (started by another thread while the server
    was being started) and imports chute's process layer does not run the script."""
    import json

    from chute._src.mp._main_preload import MAIN_ENV

    marker = tmp_path / "ran"
    script = tmp_path / "job.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    spec = {"path": str(script), "name": None, "dir": str(tmp_path), "sys_path": sys.path}
    done = subprocess.run(
        [sys.executable, "-c", "import chute._src.mp.pool"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": SRC, MAIN_ENV: json.dumps(spec)},
    )
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
