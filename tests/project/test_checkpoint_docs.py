"""Every example of docs/checkpointing.md runs as written (those whose imports exist)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "checkpointing.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
NEEDS = {"jax": "jax", "orbax": "orbax.checkpoint", "torch": "torch", "torchdata": "torchdata"}


def _missing(block: str) -> list[str]:
    roots = set(re.findall(r"^(?:import|from) (\w+)", block, flags=re.M))
    missing = []
    for root in sorted(roots & set(NEEDS)):
        try:
            importlib.import_module(NEEDS[root])
        except ImportError:
            missing.append(NEEDS[root])
    return missing


def test_the_doc_has_its_six_examples() -> None:
    assert len(BLOCKS) == 6


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_the_examples_of_checkpointing_md_run(index: int) -> None:
    block = BLOCKS[index]
    missing = _missing(block)
    if missing:
        pytest.skip(f"example {index} needs {', '.join(missing)} (not installed)")
    namespace: dict[str, Any] = {"__name__": "checkpointing_md"}
    exec(compile(block, str(DOC), "exec"), namespace)
    if "StatefulDataLoader" in block:  # restored from chute's state, not by fast-forwarding
        fetcher = namespace["state"]["fetcher_state"]
        assert list(fetcher["dataset_iter_state"]) == ["chute_state"]
