"""docs/loss_spike.md runs as written: its examples in order, in one namespace (a real
Orbax checkpoint, a real torch.save), then the `chute explain` line it shows, run on that
Orbax checkpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "loss_spike.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_its_eight_examples() -> None:
    assert len(BLOCKS) == 8


def test_the_examples_of_loss_spike_md_run_and_chute_explain_agrees(tmp_path: Path) -> None:
    pytest.importorskip("orbax.checkpoint")
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    pytest.importorskip("torchdata")
    namespace: dict[str, Any] = {"__name__": "loss_spike_md"}
    for block in BLOCKS:
        exec(compile(block, str(DOC), "exec"), namespace)

    # The shell line of the page, on the Orbax checkpoint of the restart step.
    (tmp_path / "train_data.py").write_text(
        "import chute\n\n\ndef make_data():\n"
        "    return chute.MapDataset.range(10_000).seed(0).shuffle().repeat().batch(8)"
        ".to_iter_dataset()\n"
    )
    spike, restart = namespace["spike"], namespace["restart"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path)])}
    step_dir = Path(namespace["ckpt_dir"]) / str(restart)
    argv = [sys.executable, "-m", "chute.cli", "explain", str(step_dir)]
    argv += ["--steps", f"{spike}:{spike + 1}", "--pipeline", "train_data:make_data"]
    out = subprocess.run([*argv, "--json"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["index"] for r in rows] == [r["index"] for r in namespace["at_spike"]]
    assert {r["step"] for r in rows} == {spike}
    table = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["step", "offset", "source", "index", "epoch"]
    assert [int(line.split()[3]) for line in lines] == [r["index"] for r in rows]
