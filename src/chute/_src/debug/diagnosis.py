"""What the execution summary advises: a diagnosis read from the run's measurements.

`diagnose(stats)` reads a `PipelineStats` (`_src/debug/stats.py`) in this order:

1. Does the consumer wait at all? Its share of time waiting for data, from its first
   element on (the start of worker processes left out): under `KEEPS_UP` (5%) no stage is
   a bottleneck, and nothing is advised but fewer worker processes where they exceed the
   usable cores.
2. What is the bottleneck (the stage the consumer waited on most) doing with its time,
   leaving out the time its threads were queued for a CPU:
   - on a CPU over half of it: CPU-bound; Python code holding the GIL wants worker
     processes, code that leaves the GIL free (GIL held under 35%) threads or processes;
   - off a CPU while the GIL was held in a quarter of the samples or more: waiting for
     the GIL that Python code on other threads holds, not for I/O: worker processes, not
     threads (a text pipeline's source read by 24 threads on 2 cores while they tokenize:
     40-58% held; a source sleeping 2 ms a read under 24 threads: under 1%);
   - off a CPU with the GIL mostly free: waiting for I/O or sleeps: more threads.
3. Do its threads or workers (`Parallelism`, the nearest stage above it that computes
   elsewhere) help? Fewer are advised when worker processes exceed the usable cores
   (`os.sched_getaffinity`), when threads do and the work is not waiting for I/O, or when
   the bottleneck is the stage that hands their elements over (the consumer waits on the
   hand-over more than on their work: that stage busy on a CPU, `HAND_OVER_CPU`, or the
   workers not starved, see 4), or when the consumer got its elements measurably
   (`SLOWER`, 15%) slower than the same work would take on its own thread: its own time,
   the stages' own times added up as they measured them (time queued for a CPU included:
   a CPU-bound thread on this machine queues as much now) and the time on a CPU of the
   stages that hand elements over. The estimate errs towards keeping them (time waiting
   for I/O or for the GIL counts as work, and workers queue for each other's cores too).
4. Is the machine busy? When the bottleneck's threads spent `STARVED` (25%) or more of
   their time queued for a CPU, other processes take the cores: with threads or workers
   that fit the cores, more would queue too ("free_cores"), and so when the consumer waits
   on idle hand-over while the workers behind it queue; on the consumer's thread, the
   advice says that workers would queue too.

Periodic summaries of one run pass the last verdict as `previous`: each threshold of
step 2 moves `HYSTERESIS` points in its favour, so a figure near it does not flip it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from chute._src.core.tuning import Parallelism

if TYPE_CHECKING:
    from chute._src.debug.stats import PipelineStats, StageStats

CPU_BOUND = 50.0  # % CPU above which a stage is CPU-bound
GIL_FREE = 35.0  # % GIL held below which CPU-bound work released it (native code)
GIL_WAIT = 25.0  # % GIL held from which a stage off a CPU waits for the GIL, not for I/O
HYSTERESIS = 15.0  # points a figure must move past a threshold to change a verdict
KEEPS_UP = 5.0  # % of the consumer's time waiting under which nothing is a bottleneck
STARVED = 25.0  # % of a stage's own time queued for a CPU from which the machine is busy
SLOWER = 1.15  # the run took this much longer than the work would on one thread: fewer
MIN_ELAPSED_S = 0.5  # the consumer's time a comparison with one thread needs
HAND_OVER_CPU = 25.0  # % CPU from which a stage handing elements over is busy doing so

# What the advice recommends, as `PipelineStats.recommendation` gives it.
THREADS = "threads"
PROCESSES = "processes"
THREADS_OR_PROCESSES = "threads_or_processes"
FEWER = "fewer"  # fewer threads or worker processes
FREE_CORES = "free_cores"  # other processes take the cores: more workers would queue too

_THREADS_HINT = "to_iter_dataset(chute.ReadOptions(num_threads=N))"
_WORKERS_HINT = ".mp_prefetch(chute.MultiprocessingOptions(num_workers=N))"


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The recommendation (one of the constants above, or None) and the advice's text."""

    recommendation: str | None
    text: str


def classify(cpu: float, gil: float | None, previous: str | None) -> tuple[str, bool]:
    """THREADS, PROCESSES or THREADS_OR_PROCESSES from the bottleneck's CPU and GIL
    shares, and whether it waits for the GIL (off a CPU while Python code holds it);
    `previous` shifts each threshold by `HYSTERESIS` in its own favour."""
    cpu_bound = CPU_BOUND + (HYSTERESIS if previous == THREADS else 0.0)
    cpu_bound -= HYSTERESIS if previous in (PROCESSES, THREADS_OR_PROCESSES, FEWER) else 0.0
    if cpu <= cpu_bound:
        gil_wait = GIL_WAIT + (HYSTERESIS if previous == THREADS else 0.0)
        gil_wait -= HYSTERESIS if previous in (PROCESSES, FEWER) else 0.0
        if gil is not None and gil >= gil_wait:
            return PROCESSES, True
        return THREADS, False
    gil_free = GIL_FREE + (HYSTERESIS if previous == THREADS_OR_PROCESSES else 0.0)
    gil_free -= HYSTERESIS if previous == PROCESSES else 0.0
    return (THREADS_OR_PROCESSES if gil is not None and gil < gil_free else PROCESSES), False


def waiting_percent(stats: PipelineStats) -> float | None:
    """The consumer's share of time waiting for data since its first element; None
    before a second element."""
    c = stats.consumer
    if c is None or c.elapsed_s <= 0:
        return None
    return min(100.0, 100.0 * c.waited_s / c.elapsed_s)


def keeps_up(stats: PipelineStats) -> bool:
    waiting = waiting_percent(stats)
    return waiting is not None and waiting < KEEPS_UP


def parallelism_of(stats: PipelineStats, stage: StageStats) -> Parallelism | None:
    """What computes `stage`: the parallelism of the nearest stage at or above it that
    computes elsewhere (None on the consumer's thread, or when that stage does not say)."""
    frontier, seen = [stage], {stage.id}
    while frontier:
        s = frontier.pop(0)
        if s.boundary:
            return s.parallelism
        for consumer in stats.stages:
            if s.id in consumer.inputs and consumer.id not in seen:
                seen.add(consumer.id)
                frontier.append(consumer)
    return None


def _one_thread_s(stats: PipelineStats) -> float | None:
    """About how long the consumer's run (since its first element) would take with every
    stage on its own thread: its own time, the stages' own times as they measured them
    (queued for a CPU included: a CPU-bound thread on this machine now queues so much),
    and the time on a CPU of the stages that compute elsewhere (handing elements out
    stays), one after another; None when too short to tell."""
    c = stats.consumer
    if c is None or c.elapsed_s < MIN_ELAPSED_S:
        return None
    work = sum(s.self_s for s in stats.stages if not s.boundary)
    work += sum(
        (s.cpu_percent or 0.0) / 100 * max(0.0, s.self_s - s.queued_s)
        for s in stats.stages
        if s.boundary
    )
    return (c.elapsed_s - c.waited_s) + work


def _workers(p: Parallelism) -> tuple[int, str, str]:
    """(how many, what, the option that sets them)."""
    if p.processes:
        return p.processes, "worker processes", "MultiprocessingOptions(num_workers=...)"
    return p.threads, "threads", "ReadOptions(num_threads=...)"


def _rate(per_s: float) -> str:
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.3g}"


def _queued_behind(stats: PipelineStats, boundary: StageStats) -> float:
    """The share of their own time the stages behind `boundary` (computed by its threads
    or workers) spent queued for a CPU."""
    by_id = {s.id: s for s in stats.stages}
    stack, seen = list(boundary.inputs), set()
    own = queued = 0.0
    while stack:
        i = stack.pop()
        if i in seen or i not in by_id:
            continue
        seen.add(i)
        s = by_id[i]
        if not s.boundary:
            own, queued = own + s.self_s, queued + s.queued_s
        stack.extend(s.inputs)
    return 100.0 * queued / own if own > 0 else 0.0


def _queued_percent(stage: StageStats) -> float:
    return 100.0 * stage.queued_s / stage.self_s if stage.self_s > 0 else 0.0


def diagnose(stats: PipelineStats) -> Diagnosis:
    """The recommendation and the advice for `stats` (see the module docstring)."""
    cores = stats.usable_cores
    ranked = [s for s in stats.stages if s.wait_percent > 0 and not s.pass_through]
    if not ranked:
        return Diagnosis(None, "No element has been produced yet: iterate first, then ask again.")
    waiting = waiting_percent(stats)
    if waiting is not None and waiting < KEEPS_UP:
        c = stats.consumer
        assert c is not None
        text = (
            f"No bottleneck: the consumer waited for data {waiting:.1f}% of its time "
            f"({c.waited_s:.2f} s of {c.elapsed_s:.1f} s since its first element), under "
            f"{KEEPS_UP:.0f}%: the pipeline keeps up, more threads or workers would not "
            "make it faster."
        )
        over = [
            s.parallelism.processes
            for s in stats.stages
            if s.parallelism is not None and cores and s.parallelism.processes > cores
        ]
        if over:
            text += (
                f" Its {max(over)} worker processes exceed the {cores} usable cores: fewer "
                "would do, and leave the cores to the rest of the program."
            )
        return Diagnosis(None, text)
    b = max(ranked, key=lambda s: s.wait_percent)
    head = f"Bottleneck: stage {b.id} {label(b.name)}, {b.wait_percent:.0f}% of the consumer's wait"
    if waiting is not None:
        head += f" (the consumer waited for data {waiting:.0f}% of its time)"
    cpu, gil = b.cpu_percent, stats.gil_held_percent(b)
    if cpu is None:
        return Diagnosis(None, f"{head}; its CPU time is unknown.")
    measured = f"on a CPU {cpu:.0f}% of its time" + (
        f", GIL held {gil:.0f}%" if gil is not None else ""
    )
    v, waits_for_gil = classify(cpu, gil, stats.previous)
    par = parallelism_of(stats, b) or Parallelism()
    n, what, option = _workers(par)
    queued = _queued_percent(b)
    busy = (
        f"other processes keep the {cores} usable cores busy"
        if cores
        else "other processes keep the cores busy"
    )

    # Too many threads or workers, or measurably slower than none.
    if cores and n > cores and (par.processes or v != THREADS):
        if par.processes:
            why = (
                f"at most {cores} compute at once: on a machine shared with other processes "
                "more only take a larger share of the cores from them, and each holds its "
                "memory"
            )
        elif waits_for_gil:
            why = (
                "waiting for the GIL that Python code holds, not for I/O: one of them runs "
                "Python code at a time"
            )
        elif v == PROCESSES:
            why = "CPU-bound Python code holding the GIL: one of them runs at a time"
        else:
            why = f"CPU-bound: at most {cores} compute at once"
        alternative = (
            f"; worker processes run Python code in parallel: {_WORKERS_HINT}"
            if par.threads and v == PROCESSES
            else ""
        )
        return Diagnosis(
            FEWER,
            f"{head}, {measured}: {n} {what} on {cores} usable cores, {why}. Use at most "
            f"{cores} ({option}), fewer on a busy machine{alternative}.",
        )
    if n and b.boundary:
        behind = _queued_behind(stats, b)
        if (cpu or 0.0) < HAND_OVER_CPU and behind >= STARVED:
            return Diagnosis(
                FREE_CORES,
                f"{head}, {measured}: the consumer waits on its {n} {what}, which were "
                f"queued for a CPU {behind:.0f}% of their time: {busy}, so more {what} would "
                f"queue too rather than run sooner; keep {n} or fewer until cores are free.",
            )
        return Diagnosis(
            FEWER,
            f"{head}, {measured}: the consumer waits on the {n} {what} handing elements over "
            "more than on the work they do (starting them, moving elements, or their time "
            f"queued for a CPU), so more {what} cannot help. Use fewer ({option}, 0 for "
            "none) and compare the rates, or give them more work per element handed over "
            "(batch before the stage).",
        )
    alone = _one_thread_s(stats)
    c = stats.consumer
    if n and alone is not None and c is not None and c.elapsed_s > SLOWER * alone:
        rate, could = _rate(c.elements / c.elapsed_s), _rate(c.elements / alone)
        load = (
            f", queued for a CPU {queued:.0f}% of their time: {busy}" if queued >= STARVED else ""
        )
        return Diagnosis(
            FEWER,
            f"{head}, {measured}. With {n} {what} the consumer got {rate} elements/s, "
            f"while the work its stages measured would give about {could}/s on its own "
            f"thread: the {what} cost more than they bring (starting them, handing elements "
            f"over{load}). Use fewer ({option}, 0 for none) and compare the rates.",
        )
    if n and queued >= STARVED and v != THREADS:
        return Diagnosis(
            FREE_CORES,
            f"{head}, {measured}, but its {n} {what} were queued for a CPU {queued:.0f}% of "
            f"their time: {busy}, so more {what} would queue too rather than run sooner; keep "
            f"{n} or fewer until cores are free.",
        )

    if v == THREADS:
        text = (
            f"{head}, {measured}: it mostly waits (I/O, sleeps), so more threads help, "
            f"e.g. {_THREADS_HINT}."
        )
    elif v == THREADS_OR_PROCESSES:
        text = (
            f"{head}, {measured}: CPU-bound, and the GIL was often free meanwhile (native "
            "code such as numpy or tokenizers releases it), so threads may help "
            f"(ReadOptions(num_threads=N)); worker processes help in any case: {_WORKERS_HINT}."
        )
    elif waits_for_gil:
        text = (
            f"{head}, {measured}: it waits for the GIL, held by Python code running on other "
            "threads, not for I/O, so more threads cannot help; use "
            f"worker processes, e.g. {_WORKERS_HINT}{', or fewer threads' if par.threads else ''}."
        )
    else:
        text = (
            f"{head}, {measured}: CPU-bound Python code holds the GIL, so "
            "threads cannot speed it up; use (more) worker processes, e.g. .mp_prefetch("
            "chute.MultiprocessingOptions(num_workers=N)), or move the work into a library "
            "that releases the GIL."
        )
    if queued >= STARVED and v != THREADS:
        text += (
            f" Its thread was queued for a CPU {queued:.0f}% of its time: {busy}, so worker "
            "processes would queue too: compare the rates before adding them."
        )
    for other in stats.stages:  # threads or workers elsewhere that exceed the cores
        p = other.parallelism
        if p is None or not cores or other.id == b.id or max(p.threads, p.processes) <= cores:
            continue
        k, kind, setting = _workers(p)
        text += (
            f" Stage {other.id} runs {k} {kind} on {cores} usable cores: unless they wait for "
            f"I/O, fewer ({setting}) would leave the cores"
            f"{' and the GIL' if p.threads else ''} to the rest."
        )
    return Diagnosis(v, text)


def label(name: str) -> str:
    """A stage's name as the summary shows it: a keyword before an options object
    (`read_options=ReadOptions(...)`) dropped, the value says it."""
    return re.sub(r"\b[a-z_]+=(?=[A-Z]\w*\()", "", name)
