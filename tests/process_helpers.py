"""Waiting for the processes a test started (one per host or rank), and running a script
in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import chute

SRC = str(Path(chute.__file__).resolve().parents[1])


def run_main(folder: Path, body: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Runs `body` as the `if __name__ == "__main__":` block of `folder/main.py` in a fresh
    interpreter (which imports chute's source and `folder`); it must exit 0 (its stderr is
    the message). A fresh interpreter's `sys.modules` shows what the body imported."""
    script = folder / "main.py"
    script.write_text(
        "import sys\n\nif __name__ == '__main__':\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
    )
    return run_python(folder, [str(script)], timeout=timeout)


def run_python(
    folder: Path,
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout: float = 240,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs `python *args` in a fresh interpreter that imports chute's source and `folder`,
    in `cwd` (by default this process's), with `env` (by default this process's
    environment); it must exit 0 (its stderr is the message)."""
    paths = [p for p in (str(folder), SRC, os.environ.get("PYTHONPATH", "")) if p]
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**(os.environ if env is None else env), "PYTHONPATH": os.pathsep.join(paths)},
    )
    assert done.returncode == 0, done.stderr
    return done


def wait_all(procs: Sequence[subprocess.Popen[str]], timeout: float = 120) -> None:
    """Waits for every process; each must exit 0 (its output's tail is the message). Any
    still running when one fails or times out is killed, so none outlives the test."""
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, ((out or "") + (err or ""))[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
