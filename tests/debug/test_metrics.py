"""`chute.metrics`: the export hook (the debug summary's figures sent to a callback at an
interval), the Prometheus exporter read back through prometheus_client's registry, and
the examples of docs/metrics.md (TensorBoard event files read back with TensorBoard's
own reader)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import chute
import chute.metrics
from process_helpers import run_main

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def pipeline(n: int = 1000) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(n).shuffle(seed=3).map(lambda x: x + 1).to_iter_dataset()


def test_the_callback_gets_the_summarys_figures_at_the_interval_and_at_the_end() -> None:
    rare: list[chute.PipelineStats] = []
    often: list[chute.PipelineStats] = []
    with (
        chute.metrics.export(rare.append, interval_s=3600),
        chute.metrics.export(often.append, interval_s=1e-9),
    ):
        out = list(pipeline().batch(4))
    assert len(out) == 250
    assert len(rare) == 1  # only the final call: an hour never passed
    final = rare[0]
    assert [s.elements for s in final.stages] == [1000, 1000, 1000, 1000, 250]
    assert [s.name.split("(")[0] for s in final.stages] == [
        "RangeMapDataset",
        "ShuffleMapDataset",
        "MapMapDataset",
        "PrefetchIterDataset",
        "BatchIterDataset",
    ]
    assert sum(s.wait_percent for s in final.stages) == pytest.approx(100.0)
    # Every 64 elements of the outermost stage (1, 64, 128, 192) and at the end.
    assert [c.stages[-1].elements for c in often] == [1, 64, 128, 192, 250]


def test_map_stages_in_worker_processes_are_counted() -> None:
    seen: list[chute.PipelineStats] = []
    ds = pipeline(400).mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    with chute.metrics.export(seen.append):
        assert sorted(ds) == list(range(1, 401))
    by_kind = {s.name.split("(")[0]: s.elements for s in seen[-1].stages}
    assert by_kind["MapMapDataset"] == 400 and by_kind["RangeMapDataset"] == 400


def test_a_closed_export_sends_nothing_and_new_iterators_are_plain() -> None:
    seen: list[chute.PipelineStats] = []
    e = chute.metrics.export(seen.append, interval_s=1e-9)
    it = iter(pipeline(200))
    next(it)
    e.close()
    e.close()  # twice is fine
    calls = len(seen)
    assert list(it)[-1] is not None and len(seen) == calls  # none after close
    plain = iter(pipeline(10))
    with pytest.raises(ValueError, match="records no statistics"):
        chute.stats(plain)
    assert "closed" in repr(e)


def test_a_callback_error_comes_out_of_next() -> None:
    def broken(stats: chute.PipelineStats) -> None:
        raise RuntimeError("the sink is down")

    with chute.metrics.export(broken, interval_s=1e-9):
        it = iter(pipeline(100))
        with pytest.raises(RuntimeError, match="the sink is down"):
            next(it)
        it.close()


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(TypeError, match=r"callback=3 is not callable; give a function"):
        chute.metrics.export(3)  # type: ignore[arg-type]
    for bad in (0, -1.0, float("nan"), "10"):
        with pytest.raises(ValueError, match=r"interval_s=.* is invalid; give a number of seconds"):
            chute.metrics.export(print, interval_s=bad)  # type: ignore[arg-type]


def test_nothing_is_imported_or_timed_without_an_export(tmp_path: Path) -> None:
    out = run_main(
        tmp_path,
        """
        import chute
        ds = chute.MapDataset.range(100).map(lambda x: x + 1).to_iter_dataset()
        total = sum(ds)
        layers = ("chute._src.debug.metrics", "chute._src.debug.stats", "chute._src.debug.instrument")
        print(total, [m for m in layers if m in sys.modules], "prometheus_client" in sys.modules)
        """,
        timeout=120,
    ).stdout.strip()
    assert out == "5050 [] False"


def test_the_prometheus_exporter_through_the_registry() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    exporter = chute.metrics.PrometheusExporter("eval", registry=registry)
    assert prometheus_client.generate_latest(registry).decode().count("chute_") > 0  # no samples
    assert registry.get_sample_value("chute_consumer_waiting_ratio", {"pipeline": "eval"}) is None
    seen: list[chute.PipelineStats] = []
    with chute.metrics.export(exporter), chute.metrics.export(seen.append):
        assert len(list(pipeline(300).batch(10))) == 30
    stats = seen[-1]

    def value(metric: str, index: int) -> float | None:
        """The sample of `metric` for stage `index`, as the registry gives it."""
        found = [
            sample
            for family in registry.collect()
            for sample in family.samples
            if sample.name == metric and sample.labels["stage_index"] == str(index)
        ]
        assert len(found) <= 1 and all(x.labels["pipeline"] == "eval" for x in found)
        return found[0].value if found else None

    assert (
        registry.get_sample_value(
            "chute_stage_elements_total",
            {"pipeline": "eval", "stage_index": "1", "stage": "Shuffle"},
        )
        == 300
    )
    assert value("chute_stage_elements_total", 4) == 30  # the batches
    assert [value("chute_stage_elements_total", i) for i in range(4)] == [300.0] * 4
    assert value("chute_stage_busy_seconds_total", 4) == pytest.approx(stats.stages[4].self_s)
    ratios = [value("chute_stage_wait_ratio", i) for i in range(5)]
    assert sum(r for r in ratios if r is not None) == pytest.approx(1.0)
    assert value("chute_stage_buffered_elements", 3) is not None  # the prefetch stage
    assert value("chute_stage_buffered_elements", 1) is None  # a map stage buffers nothing
    marks = [value("chute_stage_bottleneck", i) for i in range(5)]
    expected = [
        float(stats.bottleneck is not None and stats.bottleneck.id == s.id) for s in stats.stages
    ]
    assert marks == expected
    waiting = registry.get_sample_value("chute_consumer_waiting_ratio", {"pipeline": "eval"})
    assert waiting == pytest.approx((stats.waiting_percent or 0) / 100)
    text = prometheus_client.generate_latest(registry).decode()
    assert "# TYPE chute_stage_elements_total counter" in text
    # The clash names the metric (in the client library's words, whichever release).
    with pytest.raises(ValueError, match=r"chute_stage_\w+"):
        chute.metrics.PrometheusExporter("other", registry=registry)  # the same names twice
    exporter.close()
    assert value("chute_stage_elements_total", 4) is None
    assert "chute_" not in prometheus_client.generate_latest(registry).decode()


def test_the_prometheus_exporter_without_the_extra_names_it(tmp_path: Path) -> None:
    out = run_main(
        tmp_path,
        """
        sys.modules["prometheus_client"] = None  # as if the extra were not installed
        import chute.metrics
        try:
            chute.metrics.PrometheusExporter()
        except ImportError as e:
            print(e)
        """,
        timeout=120,
    ).stdout.strip()
    assert out == (
        "chute.metrics.PrometheusExporter needs prometheus_client: pip install 'chute[metrics]'"
    )


def test_the_doc_has_its_examples() -> None:
    assert len(BLOCKS) == 4


def test_the_examples_of_metrics_md_run(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("prometheus_client")
    pytest.importorskip("tensorboard", reason="the TensorBoard example reads its events back")
    pytest.importorskip("torch")
    namespace: dict[str, Any] = {"__name__": "metrics_md"}
    for block in BLOCKS:
        exec(compile(block, str(DOC), "exec"), namespace)
    printed = capsys.readouterr().out
    assert re.search(r"^4 BatchIterDataset\(batch_size=32.*\s313 elements", printed, re.M)
