"""Grain 0.2.18's own unit tests, run against chute (`tests/grain_upstream/run.py`).

The goal is 95 % of the applicable test methods, every failing one a known deliberate
difference (`KNOWN_DIFFERENCES`, each in docs/grain_differences.md). Measured 2026-11-27:
95.6 % (650 of 680 methods; 4,309 of 4,350 tests), every one of the 30 failing methods a
known deliberate difference. This guards that level: a Grain test that starts failing
fails here.

It runs Grain's test files one pytest process each, about 15 minutes on 2 cores, so it
runs only when asked: `CHUTE_GRAIN_UPSTREAM=1 pytest tests/grain_parity/test_grain_upstream.py`
(or `python tests/grain_upstream/run.py --failures` for the table).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "grain_upstream"
MEASURED_RATE = 0.955  # the level reached (650 of 680 methods); the goal was 0.95
NOT_YET_FIXED = 0  # failing methods neither fixed nor deliberate differences

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("CHUTE_GRAIN_UPSTREAM") != "1",
        reason="runs Grain's whole test suite (~15 min on 2 cores): set CHUTE_GRAIN_UPSTREAM=1",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("grain") is None,
        reason="grain is not installed: the harness runs the tests shipped in Grain's wheel "
        "(pip install grain==0.2.18, in chute's test extras)",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("parameterized") is None,
        reason="Grain's data_loader_test.py needs the parameterized package (in chute's test "
        "extras)",
    ),
]


def _harness():
    sys.path.insert(0, str(HERE))
    try:
        import run
    finally:
        sys.path.remove(str(HERE))
    return run


@pytest.mark.timeout(1800)
def test_grain_upstream_suite() -> None:
    run = _harness()
    results = run.run(jobs=1, files=run.SUITE_FILES, leave_out=run.SLOW)
    print(run.report(results, show_failures=True))
    totals = run.totals(results)
    assert not [r.file for r in results if r.collect_error], "a test file did not run whole"
    assert len(totals.unexpected) <= NOT_YET_FIXED, (
        "Grain tests failing that are not known deliberate differences:\n"
        + "\n".join(f"{k}: {v}" for k, v in sorted(totals.unexpected.items()))
    )
    assert totals.method_rate >= MEASURED_RATE, (
        f"{totals.method_rate:.3f} of the applicable methods pass (reached: {MEASURED_RATE})"
    )
