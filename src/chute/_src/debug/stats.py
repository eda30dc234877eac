"""Per-stage statistics of an instrumented iterator, and the view that prints them.

`chute.stats(it)` returns a `PipelineStats`: per stage, the elements produced, processing
time (total, min, max, mean per element), elements/s, the share of the consumer's waiting
attributed to it, its CPU share, GIL samples, and for prefetch stages the buffer occupancy
and bytes. The stages are listed as the user wrote the pipeline (sources first), with the
same counts for any number of worker processes (`_as_written`): a stage counts what it
produced, wherever it ran (a `map`/`filter` moved into workers, a shard of a stream read
in one, is shown in its place with the figures the workers sent back), and stages the
engine adds for itself (the stand-ins such moves leave behind) are folded into their
neighbours. Figures include work computed ahead of the consumer (by threads or workers).
`PipelineView` prints the execution summary and draws the graph while the iterator runs;
their text is laid out in `summary.py`.

How waiting is attributed: the consumer waits for as long as its calls into the outermost
stage take. A stage that runs on the consumer's thread accounts for its own time (its time
less its inputs'). Behind a prefetch stage (threads, worker processes) the consumer waited
`W` while the stages there spent `S` of their own time: each accounts for its own time
scaled by `min(1, W / S)` (they overlapped with the consumer), and the prefetch stage for
any excess `W - S` (its own overhead). Time a thread spent queued for a CPU (a loaded
machine) is left out of every figure, and the shares are of what remains. A pass-through stage (`mp_prefetch` with 0 workers)
is never named the bottleneck.

How the advice is chosen (`_src/debug/diagnosis.py`), the same way run after run and on an idle
or a loaded machine: first whether the consumer waits at all (under 5% of its time since
its first element: no bottleneck); then what the bottleneck does with its time, less the
time its thread was queued for a CPU (Linux's per-thread schedstat): on a CPU over half of
it, CPU-bound (worker processes; threads too when the GIL samples show it mostly free);
off a CPU with the GIL mostly held, waiting for the GIL (worker processes, not threads);
else waiting for I/O (more threads). Then whether its threads or workers help: fewer when
they exceed the usable cores or the run was measurably slower than the same work on the
consumer's thread; and whether other processes take the cores (its threads queued a
quarter of their time or more). During a run, periodic summaries keep their verdict unless
the figure moves 15 points past the threshold.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

from chute._src.core import config
from chute._src.core.iterator import DatasetIterator, walk_iterators
from chute._src.core.machine import thread_times_ns, usable_cores
from chute._src.core.tuning import Decision, Parallelism
from chute._src.debug import diagnosis
from chute._src.debug.diagnosis import FEWER, FREE_CORES, PROCESSES, THREADS, THREADS_OR_PROCESSES
from chute._src.debug.instrument import (
    StageRecord,
    TimedIterator,
    attach_view,
    nearest_records,
    stage_records,
)
from chute._src.debug.summary import graph_text, summary_text


@dataclasses.dataclass(frozen=True)
class StageStats:
    """The figures of one stage (times in seconds; per-element figures for blocks).

    `cpu_percent`: time on a CPU over the stage's own wall time less the time its thread
    was queued for a CPU (`queued_s`, part of `self_s`). `pass_through`: the stage does no
    work of its own (never named the bottleneck). `parallelism`: for a stage that computes
    elsewhere (`boundary`), the threads or worker processes doing it, where it says.
    """

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
    pass_through: bool = False
    queued_s: float = 0.0
    parallelism: Parallelism | None = None
    stage: str = ""  # the stage's kind (`Batch`, `Filter`, ...): what metrics label it by


@dataclasses.dataclass(frozen=True)
class ConsumerTime:
    """The consumer's clock from its first element to its latest (the start of threads
    and workers left out): `elapsed_s`, of which `waited_s` inside the pipeline's
    `next()`; its thread's time on a CPU and queued for one over that span; `elements`
    taken after the first."""

    elapsed_s: float
    waited_s: float
    on_cpu_s: float
    queued_s: float
    elements: int


@dataclasses.dataclass(frozen=True)
class TunedStage:
    """What `chute.AUTOTUNE` chose for one stage: its settings now, and the decisions that
    led there (oldest first), each with its reason."""

    id: int
    name: str
    current: dict[str, int]
    decisions: tuple[Decision, ...]


@dataclasses.dataclass(frozen=True)
class PipelineStats:
    """What `chute.stats(iterator)` returns."""

    stages: tuple[StageStats, ...]
    consumer_wait_s: float
    previous: str | None = None  # the verdict of the last summary of the same run
    tuned: tuple[TunedStage, ...] = ()  # what AUTOTUNE chose, stage by stage
    consumer: ConsumerTime | None = None  # None before its second element
    usable_cores: int | None = None  # os.sched_getaffinity's count

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
    def waiting_percent(self) -> float | None:
        """The consumer's share of time waiting for data since its first element (None
        before its second)."""
        return diagnosis.waiting_percent(self)

    @property
    def bottleneck(self) -> StageStats | None:
        """The stage the consumer waited on most (never a pass-through stage); None before
        any element, and when the consumer waited under 5% of its time (it keeps up)."""
        ranked = [s for s in self.stages if s.wait_percent > 0 and not s.pass_through]
        if not ranked or diagnosis.keeps_up(self):
            return None
        return max(ranked, key=lambda s: s.wait_percent)

    @property
    def recommendation(self) -> str | None:
        """What the advice recommends: "threads", "processes" or "threads_or_processes"
        (CPU-bound, but the GIL was often free) for the bottleneck; "fewer" threads or
        workers (they exceed the usable cores or slow the run); "free_cores" (other
        processes take the cores: more workers would queue too). None before any element,
        when there is no bottleneck, or when the CPU time is unknown."""
        return diagnosis.diagnose(self).recommendation

    def advice(self) -> str:
        """What to change, from where the waiting went, the bottleneck's CPU and GIL
        shares, its threads or workers and the usable cores (`_src/debug/diagnosis.py`)."""
        return diagnosis.diagnose(self).text

    def summary(self) -> str:
        """The execution summary: a table at most 100 columns wide, the advice beneath."""
        return summary_text(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumer_wait_s": self.consumer_wait_s,
            "consumer": dataclasses.asdict(self.consumer) if self.consumer else None,
            "usable_cores": self.usable_cores,
            "stages": [dataclasses.asdict(s) for s in self.stages],
            "autotune": [
                {
                    "id": t.id,
                    "name": t.name,
                    "current": dict(t.current),
                    "decisions": [dataclasses.asdict(d) for d in t.decisions],
                }
                for t in self.tuned
            ],
            "advice": self.advice(),
            "recommendation": self.recommendation,
        }

    def to_svg(self) -> str:
        """The pipeline graph as an SVG picture annotated with these figures."""
        from chute._src.debug.graph_svg import to_svg

        return to_svg(self)


class PipelineView:
    """Attached to the outermost instrumented iterator: collects, prints, draws."""

    def __init__(self, top: TimedIterator) -> None:
        self._top = top
        self._last_print = time.monotonic()
        self._printed_graph = False
        self._printed_final = False
        self._printed_at = -1  # elements produced when the summary was last printed
        self._verdict: str | None = None  # the last summary's recommendation
        # The consumer's clock: `last_ns` is set by the outermost proxy at every element;
        # at the first, its time, the wait so far and its thread's CPU figures are kept.
        self.last_ns = 0
        self._first: tuple[int, int, int, int] | None = None  # (ns, waited ns, cpu, queued)
        self._thread_times = (0, 0)  # the consumer thread's (on a CPU, queued) at last look
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

        def self_queued_ns(r: StageRecord) -> float:
            if r.boundary:
                return r.queued_estimate_ns()
            inputs = sum(records[i].queued_estimate_ns() for i in r.inputs if i in records)
            return max(0.0, r.queued_estimate_ns() - inputs)

        def cpu_percent(r: StageRecord) -> float | None:
            # Time queued for a CPU is left out: neither work nor waiting for data.
            ready = self_ns(r) - self_queued_ns(r)
            return min(100.0, 100.0 * self_cpu_ns(r) / ready) if ready > 0 else None

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

        def ready_ns(r: StageRecord) -> float:
            # Own time less time queued for a CPU: on a loaded machine the queueing lands
            # wherever the scheduler preempts, which says nothing about the stage.
            return max(0.0, self_ns(r) - self_queued_ns(r))

        def attribute(r: StageRecord) -> None:
            if r.boundary:
                # The stages behind produce what the consumer waits for: each accounts for
                # its own time, scaled down when they ran in parallel with the consumer; a
                # wait longer than their time is the prefetch stage's own overhead.
                behind = [s for s in subtree(r.inputs) if not s.boundary]
                total = sum(ready_ns(s) for s in behind)
                waited = ready_ns(r)
                scale = min(1.0, waited / total) if total else 0.0
                for s in behind:
                    wait[s.id] += ready_ns(s) * scale
                wait[r.id] += max(0.0, waited - total)
                return
            wait[r.id] += ready_ns(r)
            for i in r.inputs:
                if i in records:
                    attribute(records[i])

        top = self._top.record
        attribute(top)
        consumer = sum(wait.values()) or 1.0
        stages = []
        for r in records.values():
            buffered = _buffer_info(iters[r.id])
            it = iters[r.id]
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
                    cpu_percent=cpu_percent(r),
                    wait_percent=100.0 * wait[r.id] / consumer,
                    gil_samples=r.samples,
                    gil_busy_samples=r.gil_busy,
                    boundary=r.boundary,
                    pass_through=r.pass_through,
                    buffered_elements=buffered[0] if buffered else None,
                    buffered_bytes=buffered[1] if buffered else None,
                    spec=r.spec,
                    queued_s=self_queued_ns(r) / 1e9,
                    parallelism=it.parallelism() if it is not None and r.boundary else None,
                    stage=r.stage,
                )
            )
        internal = {r.id for r in records.values() if r.internal}
        stands_for = {r.id: [x.id for x in r.stands_for] for r in records.values() if r.stands_for}
        tuned = []
        for r, it in pairs:
            tuning = it.tuning() if it is not None else None
            if tuning is not None:
                tuned.append(
                    TunedStage(r.id, r.name, dict(tuning.current), tuple(tuning.decisions))
                )
        return PipelineStats(
            _as_written(stages, internal, stands_for, top.id),
            top.wall_ns / 1e9,
            self._verdict,
            tuple(tuned),
            self._consumer(),
            usable_cores(),
        )

    def _consumer(self) -> ConsumerTime | None:
        if self._first is None or self._top.record.elements < 2:
            return None
        at, waited, cpu, queued = self._first
        return ConsumerTime(
            elapsed_s=(self.last_ns - at) / 1e9,
            waited_s=(self._top.record.wall_ns - waited) / 1e9,
            on_cpu_s=(self._thread_times[0] - cpu) / 1e9,
            queued_s=(self._thread_times[1] - queued) / 1e9,
            elements=self._top.record.elements - 1,
        )

    # -- called by the outermost proxy --------------------------------------------------

    def tick(self) -> None:
        self._thread_times = thread_times_ns()  # on the consumer's thread
        if self._first is None:
            self._first = (self.last_ns, self._top.record.wall_ns, *self._thread_times)
        if self._viz_dir is not None and not self._printed_graph:
            self._printed_graph = True
            self._emit_graph()
        if self._debug and time.monotonic() - self._last_print >= self._interval:
            self._last_print = time.monotonic()
            self._print()

    def finished(self) -> None:
        """The iterator ended or was closed: the summary once, unless the last periodic
        one already showed these figures."""
        if self._first is not None:
            self._thread_times = thread_times_ns()
        if self._debug and not self._printed_final:
            self._printed_final = True
            if self._top.record.elements != self._printed_at:
                self._print()

    def _print(self) -> None:
        figures = self.stats()
        self._verdict = figures.recommendation or self._verdict
        self._printed_at = self._top.record.elements
        print(figures.summary(), file=sys.stderr, flush=True)

    def _emit_graph(self) -> None:
        figures = self.stats()
        text = graph_text(figures)
        if self._viz_dir:
            os.makedirs(self._viz_dir, exist_ok=True)
            Path(self._viz_dir, "pipeline_graph.txt").write_text(text + "\n")
            Path(self._viz_dir, "pipeline_graph.svg").write_text(figures.to_svg())
        else:
            print(text, file=sys.stderr, flush=True)


def _as_written(
    stages: list[StageStats], internal: set[int], stands_for: dict[int, list[int]], top: int
) -> tuple[StageStats, ...]:
    """The stages as the user wrote the pipeline, whatever ran where: the same list, in the
    same order (sources first), with the same counts, for any number of workers.

    - A stand-in (a stage moved into workers, a shard read in one) gives its place to the
      record of the work it stands for (`StageRecord.stands_for`), which leaves the chain
      it ran in: a reader that fed moved stages hands out, as written, what they received.
    - Stages the engine put in (`internal`) are folded away: a stage fed by one is fed by
      its inputs instead, and takes its share of the wait (or the one in its place does).
    - The order is a walk from the outermost stage, each stage after its inputs, in order,
      as `walk` lists a pipeline's stages.
    """
    by_id = {st.id: st for st in stages}
    heir = {s: ids[0] for s, ids in stands_for.items() if ids and ids[0] in by_id}
    taken = set(heir.values())

    def cut(ids: tuple[int, ...]) -> list[int]:
        out: list[int] = []
        for i in ids:
            out.extend(cut(by_id[i].inputs) if i in taken else [i] if i in by_id else [])
        return out

    inputs: dict[int, list[int]] = {}
    fed_moved: set[int] = set()
    for st in stages:
        if st.id not in taken:
            inputs[st.id] = [heir.get(i, i) for i in cut(st.inputs)]
            if any(i in taken for i in st.inputs):
                fed_moved.add(st.id)
    for s, t in heir.items():
        # In the stand-in's place, on its inputs; a stand-in with none (a shard read in a
        # worker) is replaced by the whole graph of what it stands for.
        own = by_id[s].inputs or by_id[t].inputs
        inputs[t] = [heir.get(i, i) for i in cut(own)]

    def visible(ids: list[int]) -> list[int]:
        out: list[int] = []
        for i in ids:
            out.extend(visible(inputs[i]) if i in internal else [i])
        return out

    wait = {i: st.wait_percent for i, st in by_id.items()}
    for h in sorted(internal & by_id.keys()):
        to = heir.get(h)
        if to is None:
            consumer = next(
                (i for i, ins in inputs.items() if h in ins and i not in internal), None
            )
            to = consumer if consumer is not None else next(iter(visible(inputs[h])), None)
        if to is not None and to not in internal:
            wait[to] += wait[h]
            wait[h] = 0.0

    order: list[int] = []
    seen: set[int] = set()
    start = heir.get(top, top)
    stack: list[tuple[int, bool]] = [(start, False)]
    while stack:
        i, expanded = stack.pop()
        if expanded:
            order.append(i)
            continue
        if i in seen:
            continue
        seen.add(i)
        stack.append((i, True))
        stack.extend((p, False) for p in reversed(visible(inputs[i])) if p not in seen)
    order += [i for i in inputs if i not in seen and i not in internal]

    out: list[StageStats] = []
    for i in order:
        st = by_id[i]
        ins = visible(inputs[i])
        elements = sum(by_id[p].elements for p in ins) if i in fed_moved else st.elements
        out.append(
            dataclasses.replace(
                st,
                inputs=tuple(ins),
                wait_percent=wait[i],
                elements=elements,
                elements_per_s=elements / st.self_s if st.self_s else None,
                mean_s=st.total_s / elements if elements else None,
            )
        )
    return tuple(out)


def _buffer_info(it: DatasetIterator[Any] | None) -> tuple[int, int] | None:
    return it.buffer_info() if it is not None else None


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
    view = _view_of(iterator)
    if view is None:
        raise ValueError(
            f"chute.stats: {iterator!r} records no statistics: turn them on before creating "
            'the iterator, with chute.config.update("py_debug_mode", True), then iter(ds).'
        )
    return view.stats()


def _view_of(iterator: Any) -> PipelineView | None:
    """The view of the outermost instrumented stage of `iterator`: itself, or the one that
    an iterator wrapping a pipeline's (a `DataLoader`'s) reads."""
    if not isinstance(iterator, DatasetIterator):
        return None
    for it in walk_iterators(iterator):
        view = getattr(it, "top", None) if isinstance(it, TimedIterator) else None
        if isinstance(view, PipelineView):
            return view
    return None


attach_view(PipelineView)  # the summary plugs into the instrumentation

__all__ = [
    "FEWER",
    "FREE_CORES",
    "PROCESSES",
    "THREADS",
    "THREADS_OR_PROCESSES",
    "ConsumerTime",
    "PipelineStats",
    "StageStats",
    "TunedStage",
    "graph_text",
    "nearest_records",
    "stats",
]
