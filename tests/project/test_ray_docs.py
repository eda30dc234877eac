"""Every python block of docs/ray.md runs as written, in order, in one namespace, on the
local Ray cluster its first block starts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import ray_helpers as rh

DOC = Path(__file__).resolve().parents[2] / "docs" / "ray.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)

pytestmark = pytest.mark.slow


def test_the_doc_has_its_examples() -> None:
    assert len(BLOCKS) == 3
    assert "ray start --head" in DOC.read_text()  # shown as shell, not run


def test_the_examples_of_ray_md_run() -> None:
    ray = pytest.importorskip("ray", reason=rh.SKIP_REASON)
    if ray.is_initialized():
        ray.shutdown()
    namespace: dict[str, Any] = {"__name__": "__main__"}  # functions travel by value
    try:
        with rh.actors_import_the_tests():  # the cluster the first block starts
            exec(compile(BLOCKS[0], str(DOC), "exec"), namespace)
        for block in BLOCKS[1:]:
            exec(compile(block, str(DOC), "exec"), namespace)
    finally:
        ray.shutdown()
    reference = [b["x"].tolist() for b in namespace["ds"]]  # no workers
    assert namespace["first"]["x"].tolist() == reference[0]
    assert [b["x"].tolist() for b in namespace["rest"]] == reference[2:]
