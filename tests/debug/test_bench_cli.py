"""`chute bench PIPELINE.py`: times a user's pipeline and prints the execution summary."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import chute
import chute.cli

PIPELINE = """
import numpy as np
import chute


def square(x):
    return {"x": np.full(4, x * x, dtype=np.int64)}


def pipeline():
    return (
        chute.MapDataset.range(5000)
        .shuffle(seed=1)
        .map(square)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .batch(16)
    )


def map_only():
    return chute.MapDataset.range(100).map(square).batch(8)


def plain():
    return ([i] * 3 for i in range(50))


def empty():
    return chute.MapDataset.range(0).to_iter_dataset()


def not_iterable():
    return 42
"""


_names = itertools.count()


def _stage_names(out: str) -> list[str]:
    """The stage column of the summary's table, each name's wrapped lines joined.

    The column's width depends on the widths of the figures beside it, so a name may break
    anywhere; it is read from the column the `--` rule under the header marks.
    """
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["id", "stage"])
    rule = lines[header + 1]
    start = rule.index("-", rule.index(" "))
    end = rule.index(" ", start)
    names: list[str] = []
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        cell = line[start:end].strip()
        if line[:start].strip():  # an id: a new stage
            names.append(cell)
        else:  # the name's next line: it broke after ", ", a space, "(" or "="
            sep = " " if names[-1].endswith(",") or not names[-1].endswith(("(", "=")) else ""
            names[-1] += sep + cell
    return names


@pytest.fixture
def pipeline_file(tmp_path: Path) -> Path:
    # A module name of its own per test: the file is imported by name.
    path = tmp_path / f"bench_pipeline_{next(_names)}.py"
    path.write_text(textwrap.dedent(PIPELINE))
    return path


def test_prints_first_batch_throughput_and_summary(
    pipeline_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert chute.cli.main(["bench", str(pipeline_file), "--batches", "50"]) == 0
    out = capsys.readouterr().out
    assert "time to first batch:" in out
    assert "throughput: 50 batches in" in out and "examples/s (batch size 16)" in out
    assert "chute execution summary:" in out
    stages = _stage_names(out)
    assert any(s.startswith("MapMapDataset(transform=square @") for s in stages), stages
    assert any(s.startswith("BatchIterDataset(batch_size=16") for s in stages), stages
    assert "Bottleneck: stage" in out
    # Debug mode and statistics are back as they were.
    assert chute.config.get("py_debug_mode") is False
    assert chute.config.get("py_dataset_visualization_output_dir") is None


def test_json_output(pipeline_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert chute.cli.main(["bench", str(pipeline_file), "--batches", "20", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["elements"] == 20 and out["batch_size"] == 16
    assert out["first_batch_s"] > 0 and out["elements_per_s"] > 0
    names = [s["name"] for s in out["stats"]["stages"]]
    assert any(n.startswith("ShuffleMapDataset") for n in names)
    assert out["stats"]["stages"][-1]["elements"] == 21
    assert out["stats"]["advice"].startswith("Bottleneck")


def test_fn_picks_another_function_and_map_datasets_are_iterated(
    pipeline_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", str(pipeline_file), "--fn", "map_only", "--json", "--batches", "1000"]
    assert chute.cli.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["elements"] == 12  # 13 batches of 8: the first, then the rest until the end
    assert out["batch_size"] == 8


def test_any_iterable_is_timed_without_stage_figures(
    pipeline_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert chute.cli.main(["bench", str(pipeline_file), "--fn", "plain"]) == 0
    out = capsys.readouterr().out
    assert "throughput: 49 batches" in out
    assert "no per-stage figures" in out


def test_graph_dir_gets_the_text_and_svg_graphs(
    pipeline_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = tmp_path / "graph"
    args = ["bench", str(pipeline_file), "--batches", "5", "--graph", str(graph)]
    assert chute.cli.main(args) == 0
    assert "MapMapDataset(transform=square" in (graph / "pipeline_graph.txt").read_text()
    svg = (graph / "pipeline_graph.svg").read_text()
    assert svg.startswith("<svg") and "transform=square" in svg


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("missing", r"defines no function 'missing': define `def missing\(\):`.*--fn NAME"),
        ("empty", r"produced no element"),
        ("not_iterable", r"returned 42, which is not iterable: return a chute dataset"),
    ],
)
def test_errors_say_what_to_fix(
    pipeline_file: Path, capsys: pytest.CaptureFixture[str], fn: str, message: str
) -> None:
    assert chute.cli.main(["bench", str(pipeline_file), "--fn", fn]) == 1
    err = capsys.readouterr().err
    assert err.startswith("chute bench: error:")
    assert re.search(message, err), err


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert chute.cli.main(["bench", str(tmp_path / "nope.py")]) == 1
    assert "is not a file: give the Python file that defines pipeline()" in capsys.readouterr().err


def test_command_line_with_worker_processes(tmp_path: Path) -> None:
    path = tmp_path / "mp_pipe.py"
    path.write_text(
        textwrap.dedent(
            """
            import chute

            def double(x):
                return x * 2

            def pipeline():
                ds = chute.MapDataset.range(400).map(double).to_iter_dataset().batch(8)
                return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
            """
        )
    )
    cmd = [sys.executable, "-m", "chute.cli", "bench", str(path), "--batches", "10", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120)
    out = json.loads(proc.stdout)
    assert out["elements"] == 10
    names = [s["name"] for s in out["stats"]["stages"]]
    assert any("double" in n for n in names)
