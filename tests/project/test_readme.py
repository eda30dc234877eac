"""The code examples of README.md run as shown (in order, in one namespace)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_python_examples_of_the_readme_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    namespace: dict[str, Any] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    state = namespace["state"]
    assert state["stage"] == "to_iter_dataset" and namespace["batch"].shape == (512, 8)
