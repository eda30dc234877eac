"""`chute bench PIPELINE.py`: the usual timing loop of a pipeline, without writing it.

PIPELINE.py defines a function (`pipeline()` unless `--fn` names another) that returns a
chute dataset or any iterable. `chute bench` builds it with statistics recorded (as in
debug mode: every stage timed, the GIL sampled; without debug mode's periodic printing),
times the first element of a fresh iterator, then iterates `--batches` elements or for
`--seconds`, whichever ends first, and prints:

- the time to the first element (iterator creation and worker start-up included);
- elements/s after it, and examples/s when elements are batches (arrays, or dicts or
  tuples of arrays, with a leading batch dimension);
- the execution summary (`chute.stats(it).summary()`) with its advice.

`--json` prints all of it as one JSON object instead; `--graph DIR` also writes the
pipeline graph (`pipeline_graph.txt` and `pipeline_graph.svg`) into DIR.

The file is imported as a module named after it, with its directory on `sys.path`, so
functions defined in it can be sent to worker processes (`mp_prefetch`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["BenchResult", "add_arguments", "bench", "load_pipeline", "run"]


@dataclasses.dataclass(frozen=True)
class BenchResult:
    """What `chute bench` measured."""

    first_s: float
    elements: int
    seconds: float
    batch_size: int | None
    stats: Any  # a PipelineStats, or None for an iterable that is not a chute dataset

    @property
    def elements_per_s(self) -> float:
        return self.elements / self.seconds if self.seconds > 0 else 0.0

    @property
    def examples_per_s(self) -> float | None:
        return self.elements_per_s * self.batch_size if self.batch_size else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "first_batch_s": self.first_s,
            "elements": self.elements,
            "seconds": self.seconds,
            "elements_per_s": self.elements_per_s,
            "batch_size": self.batch_size,
            "examples_per_s": self.examples_per_s,
            "stats": self.stats.to_dict() if self.stats is not None else None,
        }


def load_pipeline(path: str | Path, fn: str = "pipeline") -> Callable[[], Any]:
    """The function `fn` defined in the Python file `path`."""
    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} is not a file: give the Python file that defines {fn}()"
        )
    if file.suffix != ".py" or not file.stem.isidentifier():
        raise ValueError(
            f"{str(path)!r} cannot be imported: name it like a Python module, e.g. pipeline.py"
        )
    folder = str(file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.import_module(file.stem)
    loaded = Path(getattr(module, "__file__", "") or "").resolve()
    if loaded != file:
        raise ValueError(
            f"{str(path)!r} is shadowed by the module {file.stem!r} at {loaded}: rename "
            f"{file.name} to a name no installed module uses"
        )
    func = getattr(module, fn, None)
    if not callable(func):
        raise ValueError(
            f"{file.name} defines no function {fn!r}: define `def {fn}():` returning a "
            "dataset or an iterable, or name yours with --fn NAME"
        )
    return func


def _batch_size(element: Any, batched: bool) -> int | None:
    """The leading dimension of an element's first array, when the element is a batch:
    `batched` (the pipeline has a batch stage) or, not knowing, an array of 2+ dimensions."""
    stack = [element]
    while stack:
        x = stack.pop(0)
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            shape = tuple(x.shape)
            return int(shape[0]) if len(shape) >= (1 if batched else 2) else None
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
    return None


def bench(
    source: Any, batches: int = 200, seconds: float | None = 60.0, graph_dir: str | None = None
) -> BenchResult:
    """Times `source` (a dataset or an iterable): the first element, then up to `batches`
    elements or `seconds`, whichever ends first.

    >>> import chute
    >>> r = bench(chute.MapDataset.range(1000).batch(10).to_iter_dataset(), batches=50)
    >>> r.elements, r.batch_size, r.stats.stages[-1].elements
    (50, 10, 51)
    """
    from chute._src.core import config
    from chute._src.core.dataset import MapDataset
    from chute._src.debug.instrument import ensure_sampler

    if batches < 0:
        raise ValueError(f"batches={batches} is negative: give a count >= 0")
    if seconds is not None and seconds <= 0:
        raise ValueError(f"seconds={seconds} is not positive: give a duration > 0 or None")
    if isinstance(source, MapDataset):
        source = source.to_iter_dataset()
    if not isinstance(source, Iterable):
        raise ValueError(
            f"the pipeline function returned {source!r}, which is not iterable: return a "
            "chute dataset (MapDataset, IterDataset), a DataLoader or another iterable"
        )
    saved = {k: config.get(k) for k in ("py_debug_mode", "py_dataset_visualization_output_dir")}
    with tempfile.TemporaryDirectory(prefix="chute-bench-") as tmp:
        # A visualization directory turns on the statistics without debug mode's printing.
        config.update("py_debug_mode", False)
        config.update("py_dataset_visualization_output_dir", graph_dir or tmp)
        ensure_sampler()
        try:
            t0 = time.perf_counter()
            it = iter(source)
            try:
                first = next(it)
            except StopIteration:
                raise ValueError(
                    "the pipeline produced no element: check its source and filters"
                ) from None
            first_s = time.perf_counter() - t0
            n = 0
            t1 = time.perf_counter()
            deadline = t1 + seconds if seconds is not None else float("inf")
            while n < batches and time.perf_counter() < deadline:
                try:
                    next(it)
                except StopIteration:
                    break
                n += 1
            elapsed = time.perf_counter() - t1
            figures = _stats_or_none(it)
            if graph_dir and figures is not None:  # the graph again, with the final figures
                Path(graph_dir, "pipeline_graph.svg").write_text(figures.to_svg())
            close = getattr(it, "close", None)
            if close is not None:
                close()
        finally:
            for k, v in saved.items():
                config.update(k, v)
    batched = figures is not None and any(s.name.startswith("Batch") for s in figures.stages)
    return BenchResult(first_s, n, elapsed, _batch_size(first, batched), figures)


def _stats_or_none(it: Any) -> Any:
    from chute._src.debug.stats import stats

    try:
        return stats(it)
    except ValueError:
        return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pipeline", metavar="PIPELINE.py", help="a Python file defining pipeline()")
    p.add_argument(
        "--fn", default="pipeline", help="the function returning the dataset (default pipeline)"
    )
    p.add_argument(
        "--batches",
        type=int,
        default=200,
        help="elements to time after the first (default 200)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="stop after this many seconds even before --batches (default 60)",
    )
    p.add_argument("--graph", metavar="DIR", help="write pipeline_graph.txt and .svg into DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    func = load_pipeline(args.pipeline, args.fn)
    result = bench(func(), args.batches, args.seconds, args.graph)
    if args.json:
        out = {"pipeline": f"{args.pipeline}:{args.fn}", **result.to_dict()}
        print(json.dumps(out, indent=1, default=repr))
        return 0
    print(f"chute bench {args.pipeline}:{args.fn}")
    print(f"time to first batch: {result.first_s:.3f} s (iterator creation included)")
    line = (
        f"throughput: {result.elements:,} batches in {result.seconds:.2f} s, "
        f"{result.elements_per_s:,.2f} batches/s"
    )
    if result.examples_per_s is not None:
        line += f", {result.examples_per_s:,.0f} examples/s (batch size {result.batch_size})"
    print(line)
    if result.stats is None:
        print("no per-stage figures: the function returned an iterable that is not chute's")
    else:
        print()
        print(result.stats.summary())
    if args.graph:
        print(f"\ngraph: {Path(args.graph, 'pipeline_graph.txt')} (and .svg)")
    return 0
