"""Smoke run of `benchmarks/bench_checkpoint.py --quick`, chute only (~10 s).

It needs the shared tokenizer and corpus script (`shared/data` beside the checkout, or
CHUTE_SHARED_DATA); without them the test is skipped, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_checkpoint.py"


@pytest.mark.slow  # > 7 s on 2 cores: in .ci/run, not in a plain pytest run
@pytest.mark.timeout(120)
def test_bench_checkpoint_quick_chute_only(shared_data_or_skip: Path) -> None:
    pytest.importorskip("array_record")
    pytest.importorskip("tokenizers")
    env = {
        **os.environ,
        "CHUTE_SHARED_DATA": str(shared_data_or_skip),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path]),
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--lib", "chute"],
        capture_output=True,
        text=True,
        env=env,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("chute (packed")]
    assert len(rows) == 1, proc.stdout
    cells = rows[0].split()
    assert cells[-1] == "2/2", rows[0]  # both restored batches equal the originals
    assert "grain" not in proc.stdout.split("## ")[1].split("notes:")[0]
