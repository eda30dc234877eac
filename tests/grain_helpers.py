"""Running a script as a Grain user would, with chute and with the real Grain.

Shared by tests/grain_parity/test_grain_walkthroughs.py (chute's own walkthroughs of Grain's
tutorials) and tests/grain_parity/test_grain_examples.py (Grain's documented examples,
copied): the scripts are written with `import chute as grain`; `to_grain` switches the
imports back so the same script runs on grain 0.2.18, and `grain_missing` says why that run
cannot happen here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

GRAIN_VERSION = "0.2.18"

_IMPORT_LINE = re.compile(r"^(\s*(?:import|from)\s+)chute\b(.*)$", re.MULTILINE)


def to_grain(source: str) -> str:
    """The script with `import chute as grain` read as `import grain` (and
    `import chute.python as pygrain` as `import grain.python as pygrain`, and so on)."""
    switched = _IMPORT_LINE.sub(r"\1grain\2", source)
    return re.sub(r"^(\s*)import grain as grain$", r"\1import grain", switched, flags=re.M)


def imported_modules(source: str) -> list[str]:
    """The top-level packages a script's import lines name."""
    return re.findall(r"^\s*(?:import|from)\s+(\w+)", source, re.M)


def grain_missing() -> str | None:
    """Why the Grain run cannot happen here, or None when it can."""
    try:
        version = importlib.metadata.version("grain")
    except importlib.metadata.PackageNotFoundError:
        return "grain is not installed"
    if version != GRAIN_VERSION:
        return f"grain {version} is installed; the scripts target grain {GRAIN_VERSION}"
    if importlib.util.find_spec("absl") is None:
        return "absl is not installed (Grain's multiprocessing reads absl flags)"
    return None


def base_env() -> dict[str, str]:
    """The environment of a script's run: this one without PYTHONPATH, jax on the CPU."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def run_python(
    args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs `python ARGS` in a fresh interpreter and asserts it exited 0 (the message
    carries both streams)."""
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    detail = f"\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 0, f"exit status {proc.returncode}{detail}"
    return proc
