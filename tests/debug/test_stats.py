"""Debug mode statistics, the execution summary, the pipeline graph, chute.config."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import chute
import mp_pipelines as mpp
from chute.testing import assert_equal_output_after_checkpoint


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


def a_function_whose_name_is_far_too_long_to_fit_in_any_reasonable_table_column(x: int) -> int:
    return x + 1


class TransformWithALongRepr(chute.MapTransform):
    def map(self, element: int) -> int:
        return element * 2

    def __repr__(self) -> str:
        return "TransformWithALongRepr(" + ", ".join(f"option_{i}={i}" for i in range(20)) + ")"


def test_summary_fits_100_columns_with_long_names(debug_mode: None) -> None:
    ds = (
        chute.MapDataset.range(200)
        .map(a_function_whose_name_is_far_too_long_to_fit_in_any_reasonable_table_column)
        .map(TransformWithALongRepr())
        .to_iter_dataset(chute.ReadOptions(num_threads=2, prefetch_buffer_size=8))
        .batch(7)
    )
    it = iter(ds)
    list(it)
    table = chute.stats(it).summary()
    assert max(len(line) for line in table.splitlines()) <= 100, table
    assert "a_funct" in table and "TransformWithALongRepr(" in table
    # Every stage is still there, one row each (names may wrap onto further lines).
    for name in ["RangeMapDataset", "MapMapDataset", "PrefetchIterDataset", "BatchIterDataset"]:
        assert name in table


def test_summary_shows_only_the_users_stages(debug_mode: None) -> None:
    ds = (
        chute.MapDataset.range(300)
        .to_iter_dataset()
        .map(mpp.double)  # computed in the workers: the engine leaves a stage behind
        .batch(10)
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    )
    it = iter(ds)
    assert len(list(it)) == 30
    s = chute.stats(it)
    names = [st.name for st in s.stages]
    assert not any(n.startswith("_") for n in names), names
    ids = {st.id for st in s.stages}
    assert all(set(st.inputs) <= ids for st in s.stages)
    assert abs(sum(st.wait_percent for st in s.stages) - 100) < 1
    assert "_DoneInWorkers" not in s.summary() and "_DoneInWorkers" not in chute.stats(it).to_svg()


def test_mp_prefetch_without_workers_is_never_the_bottleneck(debug_mode: None) -> None:
    for _ in range(3):
        it = iter(
            chute.MapDataset.range(3000)
            .to_iter_dataset(chute.ReadOptions(num_threads=0))
            .mp_prefetch(chute.MultiprocessingOptions(num_workers=0))
        )
        list(it)
        s = chute.stats(it)
        mp_stage = next(st for st in s.stages if st.name.startswith("MultiprocessPrefetch"))
        assert mp_stage.pass_through
        assert s.bottleneck is not None and not s.bottleneck.name.startswith("Multiprocess")


def test_summary_is_printed_once(debug_mode: None, capsys: pytest.CaptureFixture[str]) -> None:
    it = iter(chute.MapDataset.range(10).map(lambda x: x).to_iter_dataset().batch(2))
    list(it)
    it.close()
    chute.stats(it)  # figures only: prints nothing
    err = capsys.readouterr().err
    assert err.count("chute execution summary") == 1, err


_BLOB = bytes(1 << 20)


def hashes(x: int) -> int:
    """CPU-bound native work: hashlib lets go of the GIL while it hashes a large buffer."""
    return hashlib.sha256(_BLOB).digest()[0] + x


def sleeps(x: int) -> int:
    time.sleep(0.001)
    return x


@pytest.fixture
def background_load() -> Iterator[None]:
    """Two processes spinning on the CPU for the length of a test."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin) for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def test_advice_is_the_same_run_after_run_under_load(
    debug_mode: None, background_load: None
) -> None:
    """Pure Python, sleeps and native code each keep their verdict with both cores busy:
    time queued for a CPU reads neither as CPU work nor as a held GIL."""
    cases = [
        (python_work, 1500, "processes", "worker processes"),
        (sleeps, 200, "threads", "more threads help"),
        (hashes, 300, "threads_or_processes", "the GIL was often free"),
    ]
    for _ in range(5):
        for fn, n, verdict, advice in cases:
            it = iter(
                chute.MapDataset.range(n).map(fn).to_iter_dataset(chute.ReadOptions(num_threads=0))
            )
            list(it)
            s = chute.stats(it)
            assert s.recommendation == verdict, s.summary()
            assert advice in s.advice()


def test_enable_profiling_prints_the_summary_of_that_pipeline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert chute.config.get("py_debug_mode") is False
    for workers in (0, 2):
        options = chute.MultiprocessingOptions(num_workers=workers, enable_profiling=True)
        ds = chute.MapDataset.range(64).map(mpp.double).to_iter_dataset().batch(8)
        assert len(list(ds.mp_prefetch(options))) == 8
        err = capsys.readouterr().err
        assert err.count("chute execution summary") == 1 and "MapMapDataset" in err, err
    # Other pipelines are not profiled, and debug mode stays off.
    list(chute.MapDataset.range(8).to_iter_dataset())
    assert "chute execution summary" not in capsys.readouterr().err
    assert chute.config.get("py_debug_mode") is False


def test_dataloader_enable_profiling(capsys: pytest.CaptureFixture[str]) -> None:
    def loader(profile: bool) -> chute.DataLoader:
        return chute.DataLoader(
            data_source=list(range(40)),
            sampler=chute.IndexSampler(40, shuffle=True, seed=0, num_epochs=1),
            operations=[chute.Batch(batch_size=8)],
            enable_profiling=profile,
        )

    plain = [b.tolist() for b in loader(False)]
    assert "chute execution summary" not in capsys.readouterr().err
    assert [b.tolist() for b in loader(True)] == plain
    assert capsys.readouterr().err.count("chute execution summary") == 1
    with pytest.raises(TypeError, match=r"enable_profiling='yes' is invalid: pass True"):
        chute.MultiprocessingOptions(enable_profiling="yes")  # type: ignore[arg-type]


def test_the_summary_knows_the_threads_workers_cores_and_the_consumers_clock(
    debug_mode: None,
) -> None:
    import os

    from chute._src.core.tuning import Parallelism

    threaded = iter(
        chute.MapDataset.range(400)
        .map(mpp.double)
        .to_iter_dataset(chute.ReadOptions(num_threads=3))
    )
    assert len(list(threaded)) == 400
    s = chute.stats(threaded)
    reader = next(st for st in s.stages if st.name.startswith("PrefetchIterDataset"))
    assert reader.parallelism == Parallelism(threads=3)
    assert s.usable_cores == len(os.sched_getaffinity(0))
    assert s.consumer is not None and s.consumer.elements == 399
    assert 0 < s.consumer.waited_s <= s.consumer.elapsed_s
    inline = iter(chute.MapDataset.range(50).to_iter_dataset(chute.ReadOptions(num_threads=0)))
    list(inline)
    reader = next(st for st in chute.stats(inline).stages if st.name.startswith("Prefetch"))
    assert not reader.boundary and reader.parallelism is None  # on the consumer's thread
    workers = iter(
        chute.MapDataset.range(64)
        .map(mpp.double)
        .to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    )
    list(workers)
    mp_stage = next(st for st in chute.stats(workers).stages if st.name.startswith("Multiprocess"))
    assert mp_stage.parallelism == Parallelism(processes=2)


def test_a_consumer_that_works_more_than_it_waits_hears_of_no_bottleneck(
    debug_mode: None,
) -> None:
    it = iter(chute.MapDataset.range(40).map(python_work).to_iter_dataset().prefetch(4))
    for _ in it:
        time.sleep(0.02)  # a training step far longer than an element's preparation
    s = chute.stats(it)
    assert s.waiting_percent is not None and s.waiting_percent < 5, s.summary()
    assert s.bottleneck is None and s.recommendation is None
    assert s.advice().startswith("No bottleneck: the consumer waited for data")
