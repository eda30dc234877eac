"""Waiting for the processes a test started (one per host or rank)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


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
