"""Per-stage statistics of an instrumented iterator, the execution summary, the text graph.

`chute.stats(it)` returns a `PipelineStats`: per stage, the elements produced, processing
time (total, min, max, mean per element), elements/s, the share of the consumer's waiting
attributed to it, GIL-held time, and for prefetch stages the buffer occupancy and bytes.

How waiting is attributed: the consumer waits for as long as its calls into the outermost
stage take. A stage that runs on the consumer's thread accounts for its own time (its time
less its inputs'). Behind a prefetch stage (threads, worker processes) the consumer waited
`W` while the stages there spent `S` of their own time: each accounts for its own time
scaled by `min(1, W / S)` (they overlapped with the consumer), and the prefetch stage for
any excess `W - S` (its own overhead).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

from chute._src import config
from chute._src.instrument import (
    StageRecord,
    TimedIterator,
    attach_view,
    nearest_records,
    stage_records,
)
from chute._src.iterator import DatasetIterator


@dataclasses.dataclass(frozen=True)
class StageStats:
    """The figures of one stage (times in seconds; per-element figures for blocks)."""

    id: int
    name: str
    inputs: tuple[int, ...]
    kind: str
    elements: int
    total_s: float
    self_s: float
    min_s: float | None
    max_s: float | None
    mean_s: float | None
    elements_per_s: float | None
    cpu_percent: float | None
    wait_percent: float
    gil_samples: int
    gil_busy_samples: int
    buffered_elements: int | None
    buffered_bytes: int | None
    spec: Any
    boundary: bool = False


@dataclasses.dataclass(frozen=True)
class PipelineStats:
    """What `chute.stats(iterator)` returns."""

    stages: tuple[StageStats, ...]
    consumer_wait_s: float

    def gil_held_percent(self, stage: StageStats) -> float | None:
        """Sampled share of `stage`'s time during which the GIL was held.

        The sampler notes the stage a thread is in when it gets the GIL, which happens
        where the GIL changes hands, often in the stages that called `stage` rather than in
        it. So the samples of `stage` and of the stages that call it on the same thread (up
        to a prefetch stage) are pooled. None with fewer than 10 samples.
        """
        by_id = {s.id: s for s in self.stages}
        region, frontier = {stage.id}, [stage.id]
        while frontier:
            i = frontier.pop()
            for s in self.stages:
                if i in s.inputs and s.id not in region and not s.boundary:
                    region.add(s.id)
                    frontier.append(s.id)
        samples = sum(by_id[i].gil_samples for i in region)
        busy = sum(by_id[i].gil_busy_samples for i in region)
        return 100.0 * busy / samples if samples >= 10 else None

    @property
    def bottleneck(self) -> StageStats | None:
        """The stage the consumer waited on most, or None before any element."""
        ranked = [s for s in self.stages if s.wait_percent > 0]
        return max(ranked, key=lambda s: s.wait_percent) if ranked else None

    def advice(self) -> str:
        """What to change: from where the waiting went, whether the bottleneck was on a CPU
        (exact: thread CPU time over wall time) and, for CPU-bound work, whether the GIL was
        free meanwhile (sampled, and only a hint: numpy releases the GIL for a moment in
        every large enough array operation, which lets the sampler in)."""
        b = self.bottleneck
        if b is None:
            return "No element has been produced yet: iterate first, then ask again."
        head = f"Bottleneck: stage {b.id} {b.name}, {b.wait_percent:.0f}% of the consumer's wait."
        cpu = b.cpu_percent
        gil = self.gil_held_percent(b)
        measured = (
            f"on or waiting for a CPU {cpu:.0f}% of its time"
            if cpu is not None
            else "CPU time unknown"
        )
        measured += f", GIL held {gil:.0f}%" if gil is not None else ""
        if cpu is not None and cpu < 50:
            return (
                f"{head} {measured}: it mostly waits (I/O, sleeps), so more threads help, "
                "e.g. to_iter_dataset(chute.ReadOptions(num_threads=N))."
            )
        if gil is not None and gil < 50:
            return (
                f"{head} {measured}: CPU-bound, and the GIL was often free meanwhile (native "
                "code such as numpy or tokenizers releases it), so threads may help "
                "(ReadOptions(num_threads=N)); worker processes help in any case: "
                ".mp_prefetch(chute.MultiprocessingOptions(num_workers=N))."
            )
        return (
            f"{head} {measured}: CPU-bound Python code holds the GIL, so threads cannot "
            "speed it up; use (more) worker processes, e.g. .mp_prefetch("
            "chute.MultiprocessingOptions(num_workers=N)), or move the work into a library "
            "that releases the GIL."
        )

    def summary(self) -> str:
        """The execution summary table, with the advice beneath it."""
        headers = [
            "id", "name", "inputs", "% wait", "total time", "min/elem", "max/elem",
            "avg/elem", "elements", "elems/s", "% CPU", "buffered",
        ]  # fmt: skip
        rows = []
        for s in self.stages:
            buffered = ""
            if s.buffered_elements is not None:
                buffered = f"{s.buffered_elements} ({_bytes(s.buffered_bytes or 0)})"
            rows.append([
                str(s.id), s.name[:60], ",".join(map(str, s.inputs)) or "-",
                f"{s.wait_percent:.1f}%", _dur(s.total_s), _dur(s.min_s), _dur(s.max_s),
                _dur(s.mean_s), f"{s.elements:,}",
                f"{s.elements_per_s:,.0f}" if s.elements_per_s else "-",
                f"{s.cpu_percent:.0f}%" if s.cpu_percent is not None else "-",
                buffered,
            ])  # fmt: skip
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
        line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"
        rule = "|" + "-" * (len(line) - 2) + "|"
        body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
        note = (
            "% wait: share of the consumer's waiting for data attributed to the stage; % CPU: "
            "time on (or queued for) a CPU over wall time of the stage's own work. Times of "
            "map stages are per element, measured over blocks."
        )
        return "\n".join(
            ["chute execution summary:", note, rule, line, rule, *body, rule, self.advice()]
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumer_wait_s": self.consumer_wait_s,
            "stages": [dataclasses.asdict(s) for s in self.stages],
            "advice": self.advice(),
        }

    def to_svg(self) -> str:
        """The pipeline graph as an SVG picture annotated with these figures."""
        from chute._src.graph_svg import to_svg

        return to_svg(self)


def _dur(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.2f} {unit}"
    return f"{s * 1e9:.0f} ns"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


class PipelineView:
    """Attached to the outermost instrumented iterator: collects, prints, draws."""

    def __init__(self, top: TimedIterator) -> None:
        self._top = top
        self._last_print = time.monotonic()
        self._printed_graph = False
        self._printed_final = False
        self._debug = bool(config.get("py_debug_mode"))
        self._viz_dir = config.get("py_dataset_visualization_output_dir")
        self._interval = float(config.get("py_debug_summary_interval_s"))

    def records(self) -> list[tuple[StageRecord, DatasetIterator[Any] | None]]:
        """Every stage's record (sources first), with the iterator of iter stages."""
        return stage_records(self._top)

    def stats(self) -> PipelineStats:
        pairs = self.records()
        records = {r.id: r for r, _ in pairs}
        iters = {r.id: it for r, it in pairs}

        def self_ns(r: StageRecord) -> int:
            if r.boundary:
                return r.wall_ns
            inputs = sum(records[i].wall_ns for i in r.inputs if i in records)
            return max(0, r.wall_ns - inputs)

        def self_cpu_ns(r: StageRecord) -> float:
            if r.boundary:
                return r.cpu_estimate_ns()
            inputs = sum(records[i].cpu_estimate_ns() for i in r.inputs if i in records)
            return max(0.0, r.cpu_estimate_ns() - inputs)

        wait: dict[int, float] = dict.fromkeys(records, 0.0)

        def subtree(ids: list[int]) -> list[StageRecord]:
            out, stack, seen = [], list(ids), set()
            while stack:
                i = stack.pop()
                if i in seen or i not in records:
                    continue
                seen.add(i)
                out.append(records[i])
                stack.extend(records[i].inputs)
            return out

        def attribute(r: StageRecord) -> None:
            if r.boundary:
                # The stages behind produce what the consumer waits for: each accounts for
                # its own time, scaled down when they ran in parallel with the consumer; a
                # wait longer than their time is the prefetch stage's own overhead.
                behind = [s for s in subtree(r.inputs) if not s.boundary]
                total = sum(self_ns(s) for s in behind)
                scale = min(1.0, r.wall_ns / total) if total else 0.0
                for s in behind:
                    wait[s.id] += self_ns(s) * scale
                wait[r.id] += max(0.0, r.wall_ns - total)
                return
            wait[r.id] += self_ns(r)
            for i in r.inputs:
                if i in records:
                    attribute(records[i])

        top = self._top.record
        attribute(top)
        consumer = top.wall_ns or 1
        stages = []
        for r in records.values():
            buffered = _buffer_info(iters[r.id])
            mean = r.wall_ns / r.elements / 1e9 if r.elements else None
            stages.append(
                StageStats(
                    id=r.id,
                    name=r.name,
                    inputs=tuple(r.inputs),
                    kind=r.kind,
                    elements=r.elements,
                    total_s=r.wall_ns / 1e9,
                    self_s=self_ns(r) / 1e9,
                    min_s=r.min_ns / 1e9 if r.elements else None,
                    max_s=r.max_ns / 1e9 if r.elements else None,
                    mean_s=mean,
                    elements_per_s=r.elements / (self_ns(r) / 1e9) if self_ns(r) else None,
                    cpu_percent=min(100.0, 100.0 * self_cpu_ns(r) / self_ns(r))
                    if self_ns(r)
                    else None,
                    wait_percent=100.0 * wait[r.id] / consumer,
                    gil_samples=r.samples,
                    gil_busy_samples=r.gil_busy,
                    boundary=r.boundary,
                    buffered_elements=buffered[0] if buffered else None,
                    buffered_bytes=buffered[1] if buffered else None,
                    spec=r.spec,
                )
            )
        return PipelineStats(tuple(stages), top.wall_ns / 1e9)

    # -- called by the outermost proxy --------------------------------------------------

    def tick(self) -> None:
        if self._viz_dir is not None and not self._printed_graph:
            self._printed_graph = True
            self._emit_graph()
        if self._debug and time.monotonic() - self._last_print >= self._interval:
            self._last_print = time.monotonic()
            print(self.stats().summary(), file=sys.stderr, flush=True)

    def finished(self) -> None:
        if self._debug and not self._printed_final:
            self._printed_final = True
            print(self.stats().summary(), file=sys.stderr, flush=True)

    def _emit_graph(self) -> None:
        figures = self.stats()
        text = graph_text(figures)
        if self._viz_dir:
            os.makedirs(self._viz_dir, exist_ok=True)
            Path(self._viz_dir, "pipeline_graph.txt").write_text(text + "\n")
            Path(self._viz_dir, "pipeline_graph.svg").write_text(figures.to_svg())
        else:
            print(text, file=sys.stderr, flush=True)


def graph_text(stats: PipelineStats) -> str:
    """Seed 003's text graph: each stage, then the spec of what it produces."""
    by_id = {s.id: s for s in stats.stages}
    lines = ["chute pipeline graph:", ""]
    done: set[int] = set()

    def emit(s: StageStats) -> None:
        if s.id in done:
            return
        done.add(s.id)
        for i in s.inputs:
            if i in by_id:
                emit(by_id[i])
        if not s.inputs:
            lines.append(f"[{s.id}] {s.name}")
        else:
            src = "" if len(s.inputs) == 1 else f"  (inputs {', '.join(map(str, s.inputs))})"
            lines.extend(["  ││", f"  ││  [{s.id}] {s.name}{src}", "  ││", "  ╲╱"])  # noqa: RUF001
        lines.append(repr(s.spec))
        lines.append("")

    for s in stats.stages:
        if not any(s.id in t.inputs for t in stats.stages):
            emit(s)
    return "\n".join(lines).rstrip()


def _buffer_info(it: DatasetIterator[Any] | None) -> tuple[int, int] | None:
    probe = getattr(it, "buffer_info", None)
    return probe() if probe is not None else None


def stats(iterator: Any) -> PipelineStats:
    """Per-stage figures of an iterator created while `py_debug_mode` was on.

    >>> import chute
    >>> chute.config.update("py_debug_mode", True)
    >>> it = iter(chute.MapDataset.range(1000).map(lambda x: x + 1).to_iter_dataset().batch(10))
    >>> _ = list(it)
    >>> s = chute.stats(it)
    >>> [st.elements for st in s.stages]
    [1000, 1000, 1000, 100]
    >>> chute.config.update("py_debug_mode", False)
    """
    view = getattr(iterator, "top", None)
    if not isinstance(view, PipelineView):
        raise ValueError(
            f"chute.stats: {iterator!r} records no statistics: turn them on before creating "
            'the iterator, with chute.config.update("py_debug_mode", True), then iter(ds).'
        )
    return view.stats()


attach_view(PipelineView)  # the summary plugs into the instrumentation

__all__ = ["PipelineStats", "StageStats", "graph_text", "nearest_records", "stats"]
