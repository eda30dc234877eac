"""Type checking: pipelines infer their element types under mypy's default settings, and
a wrong expectation or a wrong transform is reported (so the check in CI can fail)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import chute

pytest.importorskip("mypy")  # in the [test] extra

TESTS = Path(__file__).resolve().parent

# Each line marked `# E: code` must be reported with that error code, and no other line.
WRONG = textwrap.dedent(
    """
    from typing import assert_type

    import chute


    class Double(chute.MapTransform):
        def map(self, element: int) -> int:
            return element * 2


    class Keep(chute.FilterTransform):
        def filter(self, element: int) -> bool:
            return True


    ds = chute.MapDataset.range(10)
    assert_type(ds.map(lambda x: x * 2.0), chute.MapDataset[int])  # E: assert-type
    assert_type(ds.map(Double()), chute.MapDataset[str])  # E: assert-type
    ds.map(lambda x: x.upper())  # E: attr-defined
    ds.map(str).map(Double())  # E: arg-type
    ds.map(Keep())  # E: call-overload
    ds.filter(Double())  # E: arg-type
    ds.random_map(Double(), seed=1)  # E: call-overload
    name: str = ds[0]  # E: assignment
    ds.to_iter_dataset().batch(2, batch_fn=sum, pad_value=0)  # E: call-overload
    next(iter(ds.to_iter_dataset())).upper()  # E: attr-defined
    ds.map(Double()).filter(Keep()).to_iter_dataset().map(Double())
    """
)


def _mypy_path() -> dict[str, str]:
    """Points mypy at the chute being tested, unless it is installed (mypy finds it then)."""
    src = Path(chute.__file__).resolve().parents[1]
    env = dict(os.environ)
    if src.name not in ("site-packages", "dist-packages"):
        env["MYPYPATH"] = str(src)
    return env


@pytest.mark.slow  # > 7 s on 2 cores: in .ci/run, not in a plain pytest run
def test_inference_holds_under_default_settings_and_mistakes_are_reported(
    tmp_path: Path,
) -> None:
    wrong = tmp_path / "wrong.py"
    wrong.write_text(WRONG)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file=",  # mypy's defaults, not the project's settings
            "--cache-dir=/dev/null",  # writes no cache
            "--follow-imports=silent",  # chute's own modules are checked by the CI run
            "--no-pretty",
            str(TESTS / "check_types.py"),
            str(wrong),
        ],
        cwd=tmp_path,
        env=_mypy_path(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = proc.stdout + proc.stderr
    assert "check_types.py" not in output, output
    reported = {
        (int(m[1]), m[2])
        for m in re.finditer(r"wrong\.py:(\d+): error: .*\[([a-z-]+)\]$", output, re.MULTILINE)
    }
    expected = {
        (number, line.split("# E: ")[1])
        for number, line in enumerate(WRONG.splitlines(), start=1)
        if "# E: " in line
    }
    assert reported == expected, output
    assert proc.returncode == 1
