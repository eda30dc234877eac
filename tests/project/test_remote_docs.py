"""Every example of docs/remote.md runs as written (against memory://)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "remote.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_its_examples() -> None:
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_the_examples_of_remote_md_run(index: int, tmp_path: Path, monkeypatch: Any) -> None:
    pytest.importorskip("fsspec")
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path))
    namespace: dict[str, Any] = {"__name__": "remote_md"}
    exec(compile(BLOCKS[index], str(DOC), "exec"), namespace)
    if index == 0:
        assert len(namespace["first"]) == 100 and "stage" in namespace["state"]
