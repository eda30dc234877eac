"""Worker processes never run the user's main script or notebook cells.

Each case is a real script, written as the seeds write them (no `if __name__ ==
"__main__":` guard), run in a fresh interpreter with 0, 2 and 16 workers: its top level
runs once, in the main process, whatever the worker count, and its output equals the
0-worker run's. What the user defined in `__main__` reaches the workers by value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from process_helpers import SRC

WORKERS = [0, 2, 16]

# The pipeline each script ends with: a function of the script's own, with workers.
PIPELINE = """
def parse(line):
    return {{"n": json.loads(line)["n"] * 2, "pid": os.getpid()}}

ds = chute.MapDataset.source(records).map(parse).to_iter_dataset()
if {workers}:
    ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers={workers}))
out = list(ds)
print(json.dumps({{"out": [e["n"] for e in out], "workers": len({{e["pid"] for e in out}})}}))
"""


def run(
    folder: Path,
    args: list[str],
    stdin: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=folder,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def result(done: subprocess.CompletedProcess[str]) -> list[int]:
    return json.loads(done.stdout.splitlines()[-1])["out"]


def script(top: str, workers: int) -> str:
    head = "import json, os, sys\nimport chute\n"
    return head + textwrap.dedent(top) + PIPELINE.format(workers=workers)


@pytest.mark.parametrize("workers", WORKERS)
def test_a_script_without_a_guard_runs_its_top_level_once(tmp_path: Path, workers: int) -> None:
    top = """
    with open("lines.txt", "a") as f:
        f.write(f"ran in {os.getpid()}\\n")
    records = [json.dumps({"n": i}) for i in range(64)]
    """
    (tmp_path / "job.py").write_text(script(top, workers))
    done = run(tmp_path, ["job.py"])
    assert result(done) == [2 * i for i in range(64)]
    lines = (tmp_path / "lines.txt").read_text().splitlines()
    assert lines == [f"ran in {lines[0].split()[-1]}"], lines
    assert done.stderr == ""


@pytest.mark.parametrize("workers", WORKERS)
def test_a_script_that_rewrites_its_data_file_keeps_it(tmp_path: Path, workers: int) -> None:
    """The seed notebook's cells as one script: remove the output folder, write the
    ArrayRecord file, then read it with workers."""
    pytest.importorskip("array_record.python.array_record_module")
    top = """
    import shutil
    from array_record.python.array_record_module import ArrayRecordWriter

    data_path = os.path.join(os.getcwd(), "arrayrecord")
    shutil.rmtree(data_path, ignore_errors=True)
    os.makedirs(data_path)
    writer = ArrayRecordWriter(os.path.join(data_path, "train.array-record"), "group_size:1")
    for i in range(200):
        writer.write(json.dumps({"n": i}).encode("utf-8"))
    writer.close()
    source = chute.sources.ArrayRecordDataSource(os.path.join(data_path, "train.array-record"))
    records = source
    """
    (tmp_path / "job.py").write_text(script(top, workers))
    done = run(tmp_path, ["job.py"])
    assert result(done) == [2 * i for i in range(200)]
    data = tmp_path / "arrayrecord" / "train.array-record"
    assert data.stat().st_size > 0
    # Read again afterwards, in a new process: the file is whole.
    check = f"import chute; print(len(chute.sources.ArrayRecordDataSource({str(data)!r})))"
    assert run(tmp_path, ["-c", check]).stdout.strip() == "200"


@pytest.mark.parametrize("workers", WORKERS)
def test_a_script_reading_stdin_at_top_level_gets_all_of_it(tmp_path: Path, workers: int) -> None:
    top = """
    records = [line for line in sys.stdin.read().splitlines() if line]
    """
    (tmp_path / "job.py").write_text(script(top, workers))
    lines = "".join(json.dumps({"n": i}) + "\n" for i in range(100))
    done = run(tmp_path, ["job.py"], stdin=lines, timeout=60)
    assert result(done) == [2 * i for i in range(100)]


@pytest.mark.parametrize("workers", WORKERS)
def test_a_script_with_a_required_argument_sees_only_its_own_run(
    tmp_path: Path, workers: int
) -> None:
    top = """
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.out, "a") as f:
        f.write("started\\n")
    records = [json.dumps({"n": i}) for i in range(32)]
    """
    (tmp_path / "job.py").write_text(script(top, workers))
    done = run(tmp_path, ["job.py", "--out", "custom.txt"])
    assert result(done) == [2 * i for i in range(32)]
    assert "usage:" not in done.stderr, done.stderr
    assert (tmp_path / "custom.txt").read_text() == "started\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["custom.txt", "job.py"]


@pytest.mark.parametrize("workers", WORKERS)
def test_a_script_piped_to_python_runs(tmp_path: Path, workers: int) -> None:
    top = """
    print("top level", file=sys.stderr)
    records = [json.dumps({"n": i}) for i in range(48)]
    """
    done = run(tmp_path, ["-"], stdin=script(top, workers))
    assert result(done) == [2 * i for i in range(48)]
    assert done.stderr.splitlines() == ["top level"], done.stderr


@pytest.mark.parametrize("workers", WORKERS)
def test_notebook_cells_run_through_exec_run_once(tmp_path: Path, workers: int) -> None:
    """A notebook kernel executes each cell with `exec` in the namespace of `__main__`."""
    cells = [
        "import json, os\nimport chute\nprint('cell 1 ran', file=sys.stderr)\n",
        "records = [json.dumps({'n': i}) for i in range(40)]\n",
        PIPELINE.format(workers=workers),
    ]
    (tmp_path / "cells.json").write_text(json.dumps(cells))
    host = """
    import json, sys
    import __main__
    for i, cell in enumerate(json.load(open("cells.json"))):
        exec(compile(cell, f"<cell {i}>", "exec"), __main__.__dict__)
    """
    (tmp_path / "host.py").write_text(textwrap.dedent(host))
    done = run(tmp_path, ["host.py"])
    assert result(done) == [2 * i for i in range(40)]
    assert done.stderr.splitlines() == ["cell 1 ran"], done.stderr


def test_the_workers_really_computed_the_elements(tmp_path: Path) -> None:
    """The cases above run with workers, not in the main process alone."""
    top = """
    import time
    records = [json.dumps({"n": i}) for i in range(64)]
    """
    body = script(top, 2).replace(
        'return {"n"', 'time.sleep(0.01); return {"n"'
    )  # slow enough that the main process cannot compute them all while workers start
    (tmp_path / "job.py").write_text(body)
    done = run(tmp_path, ["job.py"])
    assert json.loads(done.stdout.splitlines()[-1])["workers"] >= 2


def test_a_script_importing_jax_at_top_level_runs_with_16_workers(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    top = """
    import jax
    import jax.numpy as jnp

    total = float(jnp.arange(4).sum())  # jax's threads run in this process
    records = [json.dumps({"n": i}) for i in range(64)]
    """
    (tmp_path / "job.py").write_text(script(top, 16))
    done = run(tmp_path, ["job.py"], timeout=240)
    assert result(done) == [2 * i for i in range(64)]


ENV_SCRIPT = """
import os, subprocess, threading
import chute
from chute._src.exec.mp import WorkerPool

NAMES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
seen, launches, stop = [], [0], threading.Event()


def launch():
    while not stop.is_set():
        env = subprocess.run(["env"], capture_output=True, text=True).stdout
        launches[0] += 1
        seen.extend(l for l in env.splitlines() if l.startswith(("CHUTE", *NAMES)))


def double(worker_index, num_workers, x):
    return 2 * x


thread = threading.Thread(target=launch)
thread.start()
ds = chute.MapDataset.range(50).map(abs).to_iter_dataset()
for method in ("forkserver", "spawn", "forkserver"):
    with WorkerPool(2, double, start_method=method) as pool:
        pool.put(0, 1)
        assert pool.get(0, timeout=120) == 2
    assert list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2))) == list(range(50))
stop.set()
thread.join()
print(launches[0], sorted(set(seen)))
"""


def test_no_variable_of_chutes_reaches_other_threads_subprocesses(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(ENV_SCRIPT)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CHUTE", "OPENBLAS", "OMP_", "MKL_"))
    }
    env["PYTHONPATH"] = SRC
    done = subprocess.run(
        [sys.executable, "job.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    launches, seen = done.stdout.split(maxsplit=1)
    assert int(launches) > 5
    assert seen.strip() == "[]"


def test_a_workers_traceback_points_at_the_users_file_and_line(tmp_path: Path) -> None:
    body = textwrap.dedent(
        """
        import chute

        def check(x):
            if x == 5:
                raise ValueError(f"bad element {x}")
            return x

        ds = chute.MapDataset.range(20).map(check).to_iter_dataset()
        list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
        """
    )
    (tmp_path / "job.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run(
        [sys.executable, "job.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1
    assert f'File "{tmp_path / "job.py"}", line 6, in check' in done.stderr, done.stderr
    assert 'raise ValueError(f"bad element {x}")' in done.stderr
    assert "<dynamic-code>" not in done.stderr
    assert "at element index 5" in done.stderr
    assert done.stderr.count("ValueError: bad element 5") == 1, done.stderr  # printed once
