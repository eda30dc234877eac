"""Fuzz every reader: a mutated file reads back right or raises chute.DataError.

`benchmarks/fuzz_formats.py` (the long run) does the work in worker subprocesses, so a
crash (SIGBUS, SIGSEGV) is counted rather than fatal; here it runs a few hundred seeded
mutations per format, and each format's tally is checked: no crash, no hang, no
exception other than `chute.DataError`, and for formats with checksums no record that
differs from the one written at that index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "fuzz_formats.py"
MUTATIONS = 250
FORMATS = ["crec", "crec-zstd", "arrayrecord", "tfrecord", "jsonl", "parquet", "parquet-crc"]
FORMATS += ["numpy"]
CHECKSUMMED = {"crec", "crec-zstd", "arrayrecord", "tfrecord", "parquet-crc"}


@pytest.fixture(scope="module")
def tally() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    args = ["--mutations", str(MUTATIONS), "--workers", "2", "--seed", "1000", "--timeout", "30"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.stdout, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout.splitlines()[-1]))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", FORMATS)
def test_mutated_files_read_back_or_raise_data_error(fmt: str, tally: dict[str, Any]) -> None:
    t = tally[fmt]
    assert t["mutations"] == MUTATIONS
    assert t.get("crashes", 0) == 0, t["examples"]
    assert t.get("hangs", 0) == 0, t["examples"]
    assert t.get("other", 0) == 0, t["examples"]
    # Most mutations must be noticed; a format that shrugs everything off is broken.
    assert t.get("dataerror", 0) >= MUTATIONS // 4, t
    if fmt in CHECKSUMMED:
        assert t.get("wrong", 0) == 0, t["examples"]
    if fmt.startswith("crec") or fmt == "arrayrecord":
        # A file-level checksum (trailer, footer): not even whole records may move.
        assert t.get("moved", 0) == 0, t
