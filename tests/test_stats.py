"""Debug mode statistics, the execution summary, the pipeline graph, chute.config."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

import chute
from chute.testing import assert_equal_output_after_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
import mp_pipelines as mpp


def python_work(x: int) -> int:
    total = 0
    for i in range(2000):
        total += i * x
    return total


def io_like(x: int) -> int:
    time.sleep(0.001)
    return x


def test_stats_are_off_by_default_and_say_how_to_turn_them_on() -> None:
    it = iter(chute.MapDataset.range(5).to_iter_dataset())
    next(it)
    with pytest.raises(ValueError, match=r'config\.update\("py_debug_mode", True\)'):
        chute.stats(it)


def test_per_stage_counts_times_and_wait(debug_mode: None) -> None:
    ds = (
        chute.MapDataset.range(2000)
        .shuffle(seed=1)
        .map(python_work)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .filter(lambda x: x % 3 == 0)
        .batch(10)
    )
    it = iter(ds)
    list(it)
    s = chute.stats(it)
    names = [st.name.split("(")[0] for st in s.stages]
    assert names == [
        "RangeMapDataset", "ShuffleMapDataset", "MapMapDataset", "PrefetchIterDataset",
        "FilterIterDataset", "BatchIterDataset",
    ]  # fmt: skip
    counts = {st.name.split("(")[0]: st.elements for st in s.stages}
    assert counts["MapMapDataset"] == 2000 and counts["FilterIterDataset"] == 667
    assert counts["BatchIterDataset"] == 67
    assert abs(sum(st.wait_percent for st in s.stages) - 100) < 1
    assert s.bottleneck is not None and s.bottleneck.name.startswith("MapMapDataset")
    work = next(st for st in s.stages if st.name.startswith("MapMapDataset"))
    assert work.min_s is not None and work.max_s is not None and work.mean_s is not None
    assert work.min_s <= work.mean_s <= work.max_s and work.elements_per_s
    table = s.summary()
    assert "% wait" in table and "Bottleneck: stage" in table
    assert s.to_dict()["stages"][0]["elements"] == 2000


def test_advice_tells_threads_from_processes(debug_mode: None) -> None:
    cpu = iter(
        chute.MapDataset.range(3000)
        .map(python_work)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
    )
    list(cpu)
    cpu_stats = chute.stats(cpu)
    io = iter(
        chute.MapDataset.range(300).map(io_like).to_iter_dataset(chute.ReadOptions(num_threads=0))
    )
    list(io)
    io_stats = chute.stats(io)
    assert cpu_stats.bottleneck is not None and io_stats.bottleneck is not None
    assert (io_stats.bottleneck.cpu_percent or 100) < 50
    assert "CPU-bound" in cpu_stats.advice() and "worker processes" in cpu_stats.advice()
    assert "more threads help" in io_stats.advice()


def test_worker_stages_are_merged_across_workers(debug_mode: None) -> None:
    ds = chute.MapDataset.range(400).map(mpp.double).to_iter_dataset().batch(8)
    it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
    out = list(it)
    assert len(out) == 50
    s = chute.stats(it)
    mapped = next(st for st in s.stages if st.name.startswith("MapMapDataset"))
    assert mapped.elements == 400 and mapped.total_s > 0
    assert any(st.name.endswith("in worker processes") for st in s.stages)


def test_instrumented_iterators_keep_output_and_checkpoints(debug_mode: None) -> None:
    ds = (
        chute.MapDataset.range(30)
        .shuffle(seed=3)
        .to_iter_dataset()
        .filter(lambda x: x % 3)
        .batch(4)
    )
    chute.config.update("py_debug_mode", False)
    plain = [b.tolist() for b in ds]
    chute.config.update("py_debug_mode", True)
    assert [b.tolist() for b in ds] == plain
    assert_equal_output_after_checkpoint(ds)


def test_buffered_elements_of_thread_prefetch(debug_mode: None) -> None:
    inner = chute.MapDataset.range(100).map(lambda i: np.zeros(1000)).to_iter_dataset()
    it = iter(chute.experimental.ThreadPrefetchIterDataset(inner, prefetch_buffer_size=4))
    next(it)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        prefetch = next(st for st in chute.stats(it).stages if st.name.startswith("ThreadPrefetch"))
        if prefetch.buffered_elements == 4:
            break
        time.sleep(0.01)
    assert prefetch.buffered_elements == 4 and prefetch.buffered_bytes == 4 * 8000
    it.close()


def test_summary_is_printed_in_debug_mode(
    debug_mode: None, capsys: pytest.CaptureFixture[str]
) -> None:
    list(chute.MapDataset.range(10).to_iter_dataset())
    err = capsys.readouterr().err
    assert "chute execution summary" in err and "RangeMapDataset" in err


def test_visualization_prints_the_graph_with_specs(capsys: pytest.CaptureFixture[str]) -> None:
    ds = (
        chute.MapDataset.source([{"description": "a b c"}] * 8)
        .map(lambda e: {"description": np.arange(len(e["description"]), dtype=np.int64)})
        .shuffle(seed=42)
        .repeat(2)[1::2]
        .to_iter_dataset()
        .batch(2)
    )
    chute.config.update("py_dataset_visualization_output_dir", "")
    try:
        next(iter(ds))
    finally:
        chute.config.update("py_dataset_visualization_output_dir", None)
    err = capsys.readouterr().err
    assert "chute pipeline graph:" in err
    assert "{'description': 'str[]'}" in err
    assert "{'description': 'int64[5]'}" in err
    assert "SliceMapDataset[1:16:2]" in err and "{'description': 'int64[2,5]'}" in err
    assert (
        err.index("SourceMapDataset")
        < err.index("ShuffleMapDataset")
        < err.index("BatchIterDataset")
    )


def test_visualization_writes_a_file(tmp_path: Path) -> None:
    chute.config.update("py_dataset_visualization_output_dir", str(tmp_path))
    try:
        next(iter(chute.MapDataset.range(4).to_iter_dataset()))
    finally:
        chute.config.update("py_dataset_visualization_output_dir", None)
    assert "RangeMapDataset" in (tmp_path / "pipeline_graph.txt").read_text()


def test_config_errors() -> None:
    with pytest.raises(KeyError, match=r"no option 'py_debug'.*py_debug_mode"):
        chute.config.update("py_debug", True)
    with pytest.raises(TypeError, match=r"py_debug_mode='yes' is invalid"):
        chute.config.update("py_debug_mode", "yes")


def test_text_graph_of_a_mix_names_its_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    a = chute.MapDataset.range(20).map(lambda i: np.full(3, i)).to_iter_dataset()
    b = chute.MapDataset.range(20).map(lambda i: np.full(3, -i)).to_iter_dataset()
    chute.config.update("py_dataset_visualization_output_dir", "")
    try:
        next(iter(chute.IterDataset.mix([a, b]).batch(2)))
    finally:
        chute.config.update("py_dataset_visualization_output_dir", None)
    err = capsys.readouterr().err
    mixed = next(line for line in err.splitlines() if "Mixed" in line)
    assert "(inputs " in mixed and mixed.count(",") >= 1
    assert err.count("RangeMapDataset") == 2 and "'int64[2,3]'" in err
