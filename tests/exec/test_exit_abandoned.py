"""An iterator abandoned at the end of a script (with worker processes, with threads, or
still used by a daemon thread) delays the interpreter's exit by at most about a second,
prints nothing, and leaves no process behind. Each case runs a real script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from process_helpers import SRC

SCRIPT = """
import json, os, sys, threading, time
import psutil
import chute


def slow(x):
    time.sleep(0.01)
    return x


ds = chute.MapDataset.range(100_000).map(slow).to_iter_dataset(chute.ReadOptions(num_threads=2))
workers = chute.MultiprocessingOptions(num_workers=2)
case = sys.argv[1]
if case == "workers":
    it = iter(ds.mp_prefetch(workers))
    next(it), next(it)
elif case == "threads":
    it = iter(ds)
    next(it)
else:  # a daemon thread still iterating when the main thread ends
    source = ds.mp_prefetch(workers) if case == "daemon_workers" else ds

    def run():
        for _ in source:
            pass

    threading.Thread(target=run, daemon=True).start()
    time.sleep(1.0)
children = [p.pid for p in psutil.Process().children(recursive=True)]
print(json.dumps({"end": time.time(), "children": children}), flush=True)
"""


@pytest.mark.parametrize("case", ["workers", "threads", "daemon_workers", "daemon_threads"])
def test_an_abandoned_iterator_lets_the_interpreter_exit_quietly(tmp_path: Path, case: str) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run(
        [sys.executable, "job.py", case],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    exited = time.time()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    out = json.loads(done.stdout.splitlines()[-1])
    # From the script's last line to the process's end (interpreter start-up excluded):
    # about a second at most; 3 s here so that a loaded machine does not fail it.
    assert exited - out["end"] < 3.0, exited - out["end"]
    if case in ("workers", "daemon_workers"):
        assert out["children"], "the case ran without worker processes"
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) for p in out["children"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [p for p in out["children"] if psutil.pid_exists(p)]
    zombies = [p for p in alive if psutil.Process(p).status() == psutil.STATUS_ZOMBIE]
    assert alive == zombies, alive  # (a zombie is only waiting for its reaper)


def test_a_daemon_thread_gets_its_error_while_the_program_runs() -> None:
    import threading

    import chute

    def fail_at_3(x: int) -> int:
        if x == 3:
            raise ValueError("element 3 is bad")
        return x

    got: list[object] = []

    def run() -> None:
        try:
            for x in chute.MapDataset.range(10).map(fail_at_3).to_iter_dataset():
                got.append(x)
        except ValueError as e:
            got.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert got[:3] == [0, 1, 2] and isinstance(got[3], ValueError), got
