"""The code examples of docs/frameworks.md run as shown (in order, in one namespace)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "frameworks.md"


def test_the_examples_of_frameworks_md_run() -> None:
    for module, extra in (("jax", "jax"), ("torch", "torch"), ("torchdata", "test")):
        pytest.importorskip(module, reason=f"{module} not installed: pip install 'chute[{extra}]'")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 8
    namespace: dict[str, Any] = {"__name__": "frameworks_md"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    assert namespace["rest"] and namespace["orders"][0] != namespace["orders"][1]
