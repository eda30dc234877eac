"""The engine's observer hook: the debug layer plugs into the engine, never the reverse.

Each scenario runs in a fresh interpreter, so that what is imported shows in `sys.modules`
(in this test process the debug layer may already be loaded by other tests).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import chute
from chute._src.core import config, observe
from process_helpers import run_main

DEBUG_LAYER = (
    "chute._src.debug.instrument",
    "chute._src.debug.stats",
    "chute._src.debug.graph_svg",
)

# Imported by the worker processes too: what each of them has loaded.
PROBE = f"""
import sys

DEBUG_LAYER = {DEBUG_LAYER!r}


def loaded(x):
    return [m for m in DEBUG_LAYER if m in sys.modules]


def double(x):
    return 2 * x
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "observe_probe.py").write_text(PROBE)
    return run_main(tmp_path, body)


def test_a_pipeline_run_without_debug_never_imports_the_debug_layer(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        """
        import chute
        import chute._src.core.dataset, chute._src.core.iterator, chute._src.exec.executors
        import chute._src.exec.workers.stage, chute._src.exec.reader
        from chute._src.core import observe
        import observe_probe

        base = chute.MapDataset.range(64).shuffle(seed=1).map(observe_probe.double)
        threads = base.to_iter_dataset(chute.ReadOptions(num_threads=2)).batch(8)
        assert len(list(threads)) == 8
        workers = base.map(observe_probe.loaded).to_iter_dataset().mp_prefetch(
            chute.MultiprocessingOptions(num_workers=2)
        )
        seen = list(workers)
        assert len(seen) == 64 and not any(seen), seen  # nothing loaded in the workers
        assert observe.current() is None
        print(sorted(m for m in observe_probe.DEBUG_LAYER if m in sys.modules))
        """,
    )
    assert done.stdout.strip() == "[]"


def test_debug_mode_loads_the_layer_and_merges_the_workers_figures(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        """
        import chute
        import observe_probe

        chute.config.update("py_debug_mode", True)
        for workers in (0, 2):
            ds = chute.MapDataset.range(400).map(observe_probe.double).to_iter_dataset()
            it = iter(ds.batch(8).mp_prefetch(chute.MultiprocessingOptions(num_workers=workers)))
            assert len(list(it)) == 50
            mapped = [s for s in chute.stats(it).stages if s.name.startswith("MapMapDataset")]
            assert [s.elements for s in mapped] == [400], mapped
            print(workers, "ok")
        """,
    )
    assert done.stdout.split("\n")[:2] == ["0 ok", "2 ok"]
    assert done.stderr.count("chute execution summary") == 2


def test_enable_profiling_alone_loads_the_layer_in_main_and_workers(tmp_path: Path) -> None:
    done = _run(
        tmp_path,
        """
        import chute
        import observe_probe

        for workers in (0, 2):
            options = chute.MultiprocessingOptions(num_workers=workers, enable_profiling=True)
            ds = chute.MapDataset.range(64).map(observe_probe.double).to_iter_dataset()
            assert len(list(ds.batch(8).mp_prefetch(options))) == 8
            print(workers, "ok", flush=True)
        assert chute.config.get("py_debug_mode") is False
        """,
    )
    assert done.stdout.split("\n")[:2] == ["0 ok", "2 ok"]
    summaries = done.stderr.split("chute execution summary")[1:]
    assert len(summaries) == 2, done.stderr
    for summary in summaries:  # the map's 64 elements, counted in-process or in workers
        row = next(line for line in summary.splitlines() if "MapMapDataset" in line)
        assert " 64 " in row, summary


class _Counting(observe.PipelineObserver):
    """Counts what the engine hands over, changing nothing."""

    def __init__(self) -> None:
        self.iterators = 0
        self.chains = 0

    def iterator(
        self, ds: chute.IterDataset[Any], make: Callable[[], chute.DatasetIterator[Any]]
    ) -> chute.DatasetIterator[Any]:
        self.iterators += 1
        return make()

    def map_chain(self, ds: chute.MapDataset[Any]) -> chute.MapDataset[Any]:
        self.chains += 1
        return ds

    def worker_start(self, leaves: Any) -> None:
        return None

    def figures_merger(self, leaves: Any) -> None:
        return None


@pytest.fixture
def counting() -> Any:
    import chute._src.debug.stats  # noqa: F401  (the debug layer installs itself when first imported)

    observer = _Counting()
    previous = observe.install(observer)
    try:
        yield observer
    finally:
        observe.install(previous)


def test_the_engine_asks_an_installed_observer_only_when_the_options_say_so(
    counting: _Counting,
) -> None:
    ds = chute.MapDataset.range(10).to_iter_dataset().map(lambda x: x + 1).batch(5)
    assert [b.tolist() for b in ds] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert counting.iterators == counting.chains == 0
    chute.config.update("py_dataset_visualization_output_dir", None)  # off stays off
    with config.debug_mode_here():
        it = iter(ds)
    assert [b.tolist() for b in it] == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    assert counting.iterators == 3 and counting.chains == 1  # batch, map, reader; its chain
