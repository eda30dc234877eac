"""Every python block of docs/beam.md runs as written, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("apache_beam", reason="docs/beam.md needs the [beam] extra")

DOC = Path(__file__).resolve().parents[2] / "docs" / "beam.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)

pytestmark = pytest.mark.slow


def test_the_doc_has_its_examples() -> None:
    assert len(BLOCKS) == 5
    assert "DataflowRunner" in DOC.read_text()  # shown as shell, not run


def test_the_examples_of_beam_md_run() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}  # classes travel by value
    for block in BLOCKS:
        exec(compile(block, str(DOC), "exec"), namespace)
