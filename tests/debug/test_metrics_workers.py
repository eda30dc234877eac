"""Per-stage figures do not depend on where stages run: `chute.stats` and the exported
metrics list the same stages, with the same labels and the same produced counts, for 0, 1
and 2 worker processes (issue 47, defects 2, 9 and 10). Real worker processes, real JSON
Lines files, prometheus_client's own registry."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import chute
import chute.metrics

WORKERS = (0, 1, 2)


def keep(x: int) -> bool:
    return x % 3 != 0


def double(x: int) -> int:
    return 2 * x


def numbers(start: int, n: int) -> Iterator[int]:
    return iter(range(start, start + n))


def keep_record(r: dict[str, int]) -> bool:
    return r["a"] % 3 != 0


def value_of(r: dict[str, int]) -> int:
    return r["a"] * 2


class KeepNotThirds(chute.FilterTransform):
    def filter(self, element: int) -> bool:
        return element % 3 != 0


class Double(chute.MapTransform):
    def map(self, element: int) -> int:
        return 2 * element


def options(workers: int) -> chute.MultiprocessingOptions:
    return chute.MultiprocessingOptions(num_workers=workers)


def range_pipeline(workers: int) -> chute.IterDataset[Any]:
    """The issue's pipeline: a filter that keeps 400 of 600, a map, a batch."""
    ds = chute.MapDataset.range(600).seed(1).shuffle().to_iter_dataset()
    return ds.filter(keep).map(double).batch(10).mp_prefetch(options(workers))


@pytest.fixture(scope="module")
def jsonl_files(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("jsonl")
    for f in range(3):
        lines = [json.dumps({"a": f * 100 + i}) for i in range(100)]
        (folder / f"{f}.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder / "*.jsonl")


def run(make: Callable[[], Any]) -> tuple[chute.PipelineStats, dict[tuple[str, str], float]]:
    """Iterates `make()` to its end with an export to Prometheus open: `chute.stats` of the
    iterator, and the exported `chute_stage_elements_total` by (stage_index, stage)."""
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    exporter = chute.metrics.PrometheusExporter("p", registry=registry)
    try:
        with chute.metrics.export(exporter, interval_s=3600):
            it = iter(make())
            for _ in it:
                pass
            stats = chute.stats(it)
            it.close()
        samples = {
            (s.labels["stage_index"], s.labels["stage"]): s.value
            for family in registry.collect()
            for s in family.samples
            if s.name == "chute_stage_elements_total"
        }
        labels = [
            value
            for family in registry.collect()
            for s in family.samples
            for value in s.labels.values()
        ]
    finally:
        exporter.close()
    for value in labels:  # never a path, a line or a function: editing a script keeps series
        assert not re.search(r"[/\\@]|\.py|:\d", value), value
    return stats, samples


def produced(stats: chute.PipelineStats) -> list[tuple[str, int]]:
    return [(s.stage, s.elements) for s in stats.stages]


def check_same_for_any_worker_count(make: Callable[[int], Any]) -> list[tuple[str, int]]:
    runs = {w: run(functools.partial(make, w)) for w in WORKERS}
    by_stats = {w: produced(stats) for w, (stats, _) in runs.items()}
    by_metrics = {w: samples for w, (_, samples) in runs.items()}
    assert by_stats[1] == by_stats[0] and by_stats[2] == by_stats[0]
    assert by_metrics[1] == by_metrics[0] and by_metrics[2] == by_metrics[0]
    assert by_metrics[0] == {(str(i), stage): float(n) for i, (stage, n) in enumerate(by_stats[0])}
    return by_stats[0]


def test_a_filter_counts_what_it_kept_and_keeps_its_place_with_workers() -> None:
    stages = check_same_for_any_worker_count(range_pipeline)
    assert stages == [
        ("Range", 600),
        ("Seed", 600),
        ("Shuffle", 600),
        ("Prefetch", 600),  # to_iter_dataset's reader hands all 600 to the filter
        ("Filter", 400),
        ("Map", 400),
        ("Batch", 40),
        ("MultiprocessPrefetch", 40),
    ]


def test_the_summary_still_names_the_users_functions_with_workers(debug_mode: None) -> None:
    it = iter(range_pipeline(2))
    assert len(list(it)) == 40
    names = [s.name for s in chute.stats(it).stages]
    it.close()
    assert "keep" in names[4] and names[4].startswith("FilterIterDataset(")
    assert "double" in names[5] and names[5].startswith("MapIterDataset(")
    assert not any("done in the workers" in n or "DoneInWorkers" in n for n in names)


def test_a_filter_on_the_map_side_counts_what_it_kept() -> None:
    def make(workers: int) -> chute.IterDataset[Any]:
        ds = chute.MapDataset.range(600).filter(keep).map(double).to_iter_dataset()
        return ds.batch(10).mp_prefetch(options(workers))

    stages = check_same_for_any_worker_count(make)
    assert [n for _, n in stages] == [600, 400, 400, 400, 40, 40]


def test_the_stages_of_a_shard_stream_and_the_maps_moved_into_its_workers(
    jsonl_files: str,
) -> None:
    def make(workers: int) -> chute.IterDataset[Any]:
        ds = chute.experimental.JsonlIterDataset(jsonl_files, cycle_length=2)
        return ds.filter(keep_record).map(value_of).batch(10).mp_prefetch(options(workers))

    stages = check_same_for_any_worker_count(make)
    assert stages == [
        ("FileLines", 100),  # one per file, each read in a worker with workers
        ("FileLines", 100),
        ("FileLines", 100),
        ("Jsonl", 300),
        ("Filter", 200),
        ("Map", 200),
        ("Batch", 20),
        ("MultiprocessPrefetch", 20),
    ]


def test_a_shard_of_several_stages_read_in_workers() -> None:
    def make(workers: int) -> chute.IterDataset[Any]:
        shards = [
            chute.IterDataset.source(functools.partial(numbers, 100 * i, 50)).map(double)
            for i in range(3)
        ]
        ds = chute.experimental.InterleaveIterDataset(shards, cycle_length=3)
        return ds.filter(keep).batch(5).mp_prefetch(options(workers))

    stages = check_same_for_any_worker_count(make)
    merge = [s for s, _ in stages].index("Interleave")
    assert [n for _, n in stages[:merge]] == [50, 50] * 3 and stages[merge] == ("Interleave", 150)


def loader(workers: int) -> chute.DataLoader:
    return chute.DataLoader(
        data_source=chute.sources.RangeDataSource(0, 600, 1),
        sampler=chute.IndexSampler(600, shuffle=True, seed=0, num_epochs=1),
        operations=[KeepNotThirds(), Double(), chute.Batch(batch_size=10)],
        worker_count=workers,
    )


def test_the_dataloader_for_any_worker_count() -> None:
    stages = check_same_for_any_worker_count(loader)
    filters = [n for s, n in stages if s == "Filter"]
    assert filters == [400] and stages[-2:] == [("Batch", 40), ("MultiprocessPrefetch", 40)]


def test_stats_of_a_dataloaders_iterator(debug_mode: None) -> None:
    for workers in (0, 2):
        it = iter(loader(workers))
        assert len(list(it)) == 40
        stats = chute.stats(it)  # raised "turn debug mode on", with it on
        it.close()
        assert stats.stages[-2].elements == 40 and "Filter" in [s.stage for s in stats.stages]
    chute.config.update("py_debug_mode", False)
    plain = iter(loader(0))  # made with debug mode off: the message still says what to do
    with pytest.raises(ValueError, match=r"records no statistics: turn them on"):
        chute.stats(plain)
    with pytest.raises(ValueError, match=r"records no statistics"):
        chute.stats([1, 2, 3])
    plain.close()


def test_labels_survive_an_edit_of_the_script(tmp_path: Path) -> None:
    """The same pipeline from two versions of a script (its functions on other lines)
    exports the same series."""
    outputs = []
    for padding in ("", "\n\n\n# an edit moves the functions down\n"):
        module = tmp_path / f"user_script_{len(padding)}.py"
        module.write_text(padding + "def keep(x):\n    return x % 3 != 0\n")
        namespace: dict[str, Any] = {}
        exec(compile(module.read_text(), str(module), "exec"), namespace)
        ds = chute.MapDataset.range(60).to_iter_dataset().filter(namespace["keep"])
        _, samples = run(functools.partial(ds.batch, 4))
        outputs.append(samples)
    assert outputs[0] == outputs[1] and ("2", "Filter") in outputs[0]


def stopping_early(workers: int, threads: int = 0) -> chute.IterDataset[Any]:
    """A stream that stops early: the reader computes blocks of the MapDataset ahead of
    the `limit` (growing blocks in process, chunks on threads or in workers)."""
    mds = chute.MapDataset.range(600).filter(keep).map(double)
    ds = mds.to_iter_dataset(chute.ReadOptions(num_threads=threads)).limit(25)
    return ds.mp_prefetch(options(workers))


@pytest.mark.parametrize("threads", [0, 4])
def test_a_stream_that_stops_early_counts_what_the_reader_handed_out(threads: int) -> None:
    """The stages under `to_iter_dataset` count the reader's positions handed out (25
    elements kept, from the first 38 positions), not the blocks computed ahead of the
    limit, whose size depends on the worker count, threads and timing (conformance
    finding new-1)."""
    stages = check_same_for_any_worker_count(functools.partial(stopping_early, threads=threads))
    assert stages == [
        ("Range", 38),
        ("Filter", 25),
        ("Map", 25),
        ("Prefetch", 25),
        ("Limit", 25),
        ("MultiprocessPrefetch", 25),
    ]


def test_a_restored_reader_counts_from_where_it_was_restored() -> None:
    """Blocks computed ahead of a restore are not counted; the restored run counts what
    it handed out from the restored position on."""
    chute.config.update("py_debug_mode", True)
    try:
        for workers in WORKERS:
            it = iter(stopping_early(workers))
            for _ in range(5):
                next(it)
            state = it.get_state()
            for _ in range(10):
                next(it)
            it.set_state(state)
            rest = list(it)
            stats = chute.stats(it)
            it.close()
            assert len(rest) == 20
            # 25 handed out from position 0 (15 of them before the restore, 5 again after
            # it, then 15 more): the Map counts every element handed out.
            assert dict(produced(stats))["Map"] == 35, (workers, produced(stats))
    finally:
        chute.config.update("py_debug_mode", False)
