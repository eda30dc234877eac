"""Grain 0.2.18's own unit tests, run against chute (`tests/grain_upstream/run.py`).

At least 95 % of the applicable test methods pass, and every failing one is a known
deliberate difference (`KNOWN_DIFFERENCES`, each in docs/grain_differences.md): a test of
Grain's that starts failing fails here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "grain_upstream"

pytestmark = [
    pytest.mark.slow,
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
    assert not totals.unexpected, (
        "Grain tests failing that are not known deliberate differences:\n"
        + "\n".join(f"{k}: {v}" for k, v in sorted(totals.unexpected.items()))
    )
    assert totals.method_rate >= 0.95, f"{totals.method_rate:.3f} of the applicable methods pass"
