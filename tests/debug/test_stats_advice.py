"""The execution summary's diagnosis on given figures (as the autotune tests give rates).

The pipeline is seed 003's text pipeline as the summary sees it: a source, json.loads and
tokenize behind a reader (`to_iter_dataset`, threads or worker processes), then a batch.
Each test gives the figures a run measured and checks the recommendation and the advice.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import chute
from chute._src.core.tuning import Parallelism
from chute._src.debug.stats import ConsumerTime

SOURCE, PARSE, TOKENIZE, READER, BATCH = range(5)


def stage(
    id: int,
    inputs: tuple[int, ...] = (),
    *,
    wait: float = 0.0,
    cpu: float | None = 100.0,
    self_s: float = 1.0,
    queued_s: float = 0.0,
    gil: tuple[int, int] = (0, 0),
    boundary: bool = False,
    parallelism: Parallelism | None = None,
) -> chute.StageStats:
    """A stage's figures: `gil` is (samples, samples with the GIL held)."""
    names = ["SourceMapDataset(source=ArrayRecordDataSource)", "MapMapDataset(transform=loads)"]
    names += ["MapMapDataset(transform=Tokenize)", "PrefetchIterDataset(ReadOptions(...))"]
    names += ["BatchIterDataset(batch_size=512)"]
    return chute.StageStats(
        id=id,
        name=names[id],
        inputs=inputs,
        kind="map" if id < READER else "iter",
        elements=10_000,
        total_s=self_s,
        self_s=self_s,
        min_s=None,
        max_s=None,
        mean_s=None,
        elements_per_s=None,
        cpu_percent=cpu,
        wait_percent=wait,
        gil_samples=gil[0],
        gil_busy_samples=gil[1],
        buffered_elements=None,
        buffered_bytes=None,
        spec=None,
        boundary=boundary,
        queued_s=queued_s,
        parallelism=parallelism,
    )


def text_pipeline(
    *,
    parallelism: Parallelism,
    source: dict[str, Any],
    tokenize: dict[str, Any],
    consumer: ConsumerTime | None = None,
    cores: int | None = 2,
    previous: str | None = None,
) -> chute.PipelineStats:
    """Seed 003's pipeline with the given figures for its source and tokenize stages (the
    rest small); the wait shares add up to 100."""
    rest = 100.0 - source.get("wait", 0.0) - tokenize.get("wait", 0.0)
    stages = (
        stage(SOURCE, **source),
        stage(PARSE, (SOURCE,), wait=rest / 3, self_s=0.1),
        stage(TOKENIZE, (PARSE,), **tokenize),
        stage(
            READER, (TOKENIZE,), wait=rest / 3, self_s=0.1, boundary=True, parallelism=parallelism
        ),
        stage(BATCH, (READER,), wait=rest / 3, self_s=0.05),
    )
    return chute.PipelineStats(
        stages, 10.0, previous=previous, consumer=consumer, usable_cores=cores
    )


def waited(share: float, elapsed_s: float = 10.0, queued_s: float = 0.0) -> ConsumerTime:
    """A consumer that waited `share` of `elapsed_s` for data."""
    return ConsumerTime(
        elapsed_s=elapsed_s,
        waited_s=share * elapsed_s,
        on_cpu_s=(1 - share) * elapsed_s,
        queued_s=queued_s,
        elements=1000,
    )


THREADS_24 = Parallelism(threads=24)


def test_threads_waiting_for_the_gil_are_told_from_threads_waiting_for_io() -> None:
    # 24 threads on 2 cores: the source is off a CPU (3%) while the GIL is held (80% of
    # the samples): tokenize's Python code holds it. Seed 003 measured 735 rows/s with 24
    # threads against 1,860 with none.
    gil_bound = text_pipeline(
        parallelism=THREADS_24,
        source={"wait": 74.0, "cpu": 3.0, "self_s": 8.0, "gil": (100, 80)},
        tokenize={"wait": 20.0, "cpu": 97.0, "self_s": 2.0, "gil": (50, 45)},
    )
    assert gil_bound.bottleneck is not None and gil_bound.bottleneck.id == SOURCE
    assert gil_bound.recommendation == "fewer"
    assert (
        "24 threads on 2 usable cores, waiting for the GIL that Python code holds, not for I/O"
        in gil_bound.advice()
    )
    assert (
        "one of them runs Python code at a time. Use at most 2 (ReadOptions(num_threads=...))"
        in gil_bound.advice()
    )
    assert "more threads help" not in gil_bound.advice()
    # The same source waiting for storage: the GIL mostly free, so more threads help, even
    # beyond the cores (they sleep).
    io_bound = text_pipeline(
        parallelism=THREADS_24,
        source={"wait": 74.0, "cpu": 3.0, "self_s": 8.0, "gil": (100, 10)},
        tokenize={"wait": 20.0, "cpu": 97.0, "self_s": 2.0, "gil": (50, 5)},
    )
    assert io_bound.recommendation == "threads"
    assert "it mostly waits (I/O, sleeps), so more threads help" in io_bound.advice()


def test_waiting_for_the_gil_within_the_cores_wants_processes_not_threads() -> None:
    stats = text_pipeline(
        parallelism=Parallelism(threads=2),
        source={"wait": 70.0, "cpu": 5.0, "self_s": 8.0, "gil": (100, 70)},
        tokenize={"wait": 20.0, "cpu": 97.0, "self_s": 2.0},
        cores=4,
    )
    assert stats.recommendation == "processes"
    assert "it waits for the GIL, held by Python code running on other threads" in stats.advice()
    assert "more threads cannot help; use worker processes" in stats.advice()


def test_a_consumer_that_hardly_waits_has_no_bottleneck() -> None:
    # A training loop fed through .prefetch(2) waited 0.86% of its time.
    figures: dict[str, Any] = {
        "parallelism": Parallelism(threads=1),
        "source": {"wait": 10.0, "cpu": 30.0},
        "tokenize": {"wait": 80.0, "cpu": 98.0},
    }
    fed = text_pipeline(**figures, consumer=waited(0.0086))
    assert fed.waiting_percent == pytest.approx(0.86)
    assert fed.bottleneck is None and fed.recommendation is None
    assert fed.advice().startswith(
        "No bottleneck: the consumer waited for data 0.9% of its time (0.09 s of 10.0 s"
    )
    assert "Bottleneck:" not in fed.summary() and "use (more) worker processes" not in fed.summary()
    # At 6% it waits: the stage it waits on is named.
    hungry = text_pipeline(**figures, consumer=waited(0.06))
    assert hungry.bottleneck is not None and hungry.bottleneck.id == TOKENIZE
    assert hungry.recommendation == "processes"
    assert "(the consumer waited for data 6% of its time)" in hungry.advice()
    # Without the consumer's clock (before its second element) nothing changes.
    assert text_pipeline(**figures).recommendation == "processes"


def test_a_consumer_that_keeps_up_with_more_workers_than_cores_hears_fewer_would_do() -> None:
    stats = text_pipeline(
        parallelism=Parallelism(processes=16),
        source={"wait": 10.0},
        tokenize={"wait": 80.0},
        consumer=waited(0.01),
    )
    assert stats.recommendation is None
    assert "Its 16 worker processes exceed the 2 usable cores: fewer would do" in stats.advice()


def test_more_workers_than_cores_are_told_to_be_fewer() -> None:
    figures: dict[str, Any] = {
        "source": {"wait": 5.0, "cpu": 90.0, "self_s": 0.5},
        "tokenize": {"wait": 85.0, "cpu": 98.0, "self_s": 40.0, "gil": (100, 90)},
        "consumer": waited(0.99),
    }
    sixteen = text_pipeline(parallelism=Parallelism(processes=16), **figures)
    assert sixteen.bottleneck is not None and sixteen.bottleneck.id == TOKENIZE
    assert sixteen.recommendation == "fewer"
    assert "16 worker processes on 2 usable cores" in sixteen.advice()
    assert (
        "at most 2 compute at once: on a machine shared with other processes more only take "
        "a larger share of the cores from them"
    ) in sixteen.advice()
    assert "Use at most 2 (MultiprocessingOptions(num_workers=...))" in sixteen.advice()
    assert "use (more) worker processes" not in sixteen.advice()
    # Two workers on two cores, which help (their work added up, 40.5 s, is four times
    # the run), are not told to be fewer.
    two = text_pipeline(parallelism=Parallelism(processes=2), **figures)
    assert two.recommendation == "processes"
    # Without the usable cores the count is not judged.
    assert (
        text_pipeline(parallelism=Parallelism(processes=16), cores=None, **figures).recommendation
        == "processes"
    )


def test_workers_that_measurably_slow_the_run_are_told_to_be_fewer() -> None:
    # 2 workers: the consumer waited 9.5 s of 10 s, while the stages' own times add up to
    # 2.65 s and the reader handing elements out was on a CPU 0.1 s: on the consumer's
    # thread the run would take about 0.5 + 2.75 s, not 10 s.
    figures: dict[str, Any] = {
        "parallelism": Parallelism(processes=2),
        "source": {"wait": 5.0, "cpu": 90.0, "self_s": 0.5},
        "tokenize": {"wait": 85.0, "cpu": 98.0, "self_s": 2.0},
    }
    slow = text_pipeline(**figures, consumer=waited(0.95))
    assert slow.recommendation == "fewer"
    advice = slow.advice()
    assert (
        "With 2 worker processes the consumer got 100 elements/s, while the work its stages "
        in advice
    )
    assert "would give about 308/s on its own thread" in advice
    assert "Use fewer (MultiprocessingOptions(num_workers=...), 0 for none)" in advice
    # 15% slower is the margin: 3.25 s (0.5 s its own, 2.75 s the stages') for 3.6 s is within.
    assert (
        text_pipeline(**figures, consumer=waited(0.86, elapsed_s=3.6)).recommendation == "processes"
    )
    # Too short a run (under 0.5 s since the first element) is not judged.
    assert (
        text_pipeline(**figures, consumer=waited(0.95, elapsed_s=0.4)).recommendation == "processes"
    )


def test_workers_starved_by_other_processes_are_not_told_to_be_more() -> None:
    # Two workers on two cores, each queued for a CPU 57% of its time (other processes
    # keep the cores busy); their work added up (40 s) is four times the run: they help.
    stats = text_pipeline(
        parallelism=Parallelism(processes=2),
        source={"wait": 5.0, "cpu": 90.0, "self_s": 0.5},
        tokenize={"wait": 85.0, "cpu": 98.0, "self_s": 40.0, "queued_s": 22.8},
        consumer=waited(0.99),
    )
    assert stats.recommendation == "free_cores"
    advice = stats.advice()
    assert (
        "its 2 worker processes were queued for a CPU 57% of their time: other processes keep the 2 usable cores busy"
        in advice
    )
    assert "keep 2 or fewer until cores are free" in advice
    assert "use (more) worker processes" not in advice


def test_work_on_the_consumers_thread_of_a_busy_machine_keeps_its_verdict_with_a_warning() -> None:
    stats = text_pipeline(
        parallelism=Parallelism(),
        source={"wait": 5.0, "cpu": 90.0, "self_s": 0.5},
        tokenize={"wait": 85.0, "cpu": 98.0, "self_s": 20.0, "queued_s": 13.0, "gil": (50, 45)},
        consumer=waited(0.99),
    )
    assert stats.recommendation == "processes"
    advice = stats.advice()
    assert "use (more) worker processes" in advice
    assert (
        "Its thread was queued for a CPU 65% of its time: other processes keep the 2 usable cores busy, so worker processes would queue too"
        in advice
    )


@pytest.mark.parametrize(
    ("cpu", "gil", "previous", "verdict"),
    [
        (45.0, 10, None, "threads"),
        (55.0, 80, None, "processes"),
        (60.0, 10, "threads", "threads"),  # within 15 points: the verdict holds
        (40.0, 80, "processes", "processes"),
        (55.0, 30, None, "threads_or_processes"),
        (55.0, 45, "threads_or_processes", "threads_or_processes"),
        (20.0, 30, None, "processes"),  # off a CPU, GIL held: waits for the GIL
        (20.0, 20, None, "threads"),
        (20.0, 35, "threads", "threads"),  # 40 needed to leave threads
        (20.0, 15, "processes", "processes"),  # 10 enough to stay
    ],
)
def test_periodic_verdicts_keep_their_side_of_each_threshold(
    cpu: float, gil: int, previous: str | None, verdict: str
) -> None:
    stats = text_pipeline(
        parallelism=Parallelism(threads=2),
        source={"wait": 80.0, "cpu": cpu, "gil": (100, gil)},
        tokenize={"wait": 10.0},
        consumer=waited(0.9, elapsed_s=0.1),
        cores=4,
        previous=previous,
    )
    assert stats.recommendation == verdict


def test_the_bottleneck_behind_worker_processes_takes_their_count() -> None:
    stats = text_pipeline(
        parallelism=Parallelism(processes=8),
        source={"wait": 5.0},
        tokenize={"wait": 85.0},
    )
    assert stats.recommendation == "fewer"  # 8 > 2 usable cores, found above tokenize
    assert stats.to_dict()["usable_cores"] == 2
    assert stats.to_dict()["stages"][READER]["parallelism"] == {"threads": 0, "processes": 8}


def test_a_consumer_waiting_on_the_hand_over_is_told_fewer_workers() -> None:
    # The reader that hands the workers' elements over is the bottleneck: the consumer
    # waited longer than the workers' work took (elements that cost next to nothing).
    figures = text_pipeline(
        parallelism=Parallelism(processes=2),
        source={"wait": 5.0, "cpu": 90.0, "self_s": 0.5},
        tokenize={"wait": 10.0, "cpu": 98.0, "self_s": 2.0},
    )
    shares = {SOURCE: 5.0, PARSE: 2.0, TOKENIZE: 10.0, READER: 80.0, BATCH: 3.0}
    stages = tuple(dataclasses.replace(s, wait_percent=shares[s.id]) for s in figures.stages)
    stats = dataclasses.replace(figures, stages=stages)
    assert stats.bottleneck is not None and stats.bottleneck.id == READER
    assert stats.recommendation == "fewer"
    assert (
        "the consumer waits on the 2 worker processes handing elements over more than on the "
        "work they do"
    ) in stats.advice()
    assert "Use fewer (MultiprocessingOptions(num_workers=...), 0 for none)" in stats.advice()


def test_a_consumer_waiting_on_starved_workers_is_not_told_fewer() -> None:
    # Seed 003 with 2 workers on a busy machine: the consumer waits on the reader, which is
    # idle (4% on a CPU) while the workers behind it are queued for a CPU 57% of their time
    # (their ready time is short, the wait lands on the reader); 2 workers ran 1,217 rows/s
    # against 757 without.
    def run(queued_s: float) -> chute.PipelineStats:
        figures = text_pipeline(
            parallelism=Parallelism(processes=2),
            source={"wait": 5.0, "cpu": 90.0, "self_s": 0.5},
            tokenize={"wait": 30.0, "cpu": 98.0, "self_s": 10.0, "queued_s": queued_s},
        )
        reader: dict[int, dict[str, Any]] = {READER: {"wait_percent": 50.0, "cpu_percent": 4.0}}
        stages = tuple(dataclasses.replace(s, **reader.get(s.id, {})) for s in figures.stages)
        return dataclasses.replace(figures, stages=stages)

    starved = run(queued_s=6.0)
    assert starved.bottleneck is not None and starved.bottleneck.id == READER
    assert starved.recommendation == "free_cores"
    assert "the consumer waits on its 2 worker processes, which were queued for a CPU 57%" in (
        starved.advice()
    )
    assert "keep 2 or fewer until cores are free" in starved.advice()
    assert run(queued_s=0.5).recommendation == "fewer"  # not starved: the hand-over


def test_threads_beyond_the_cores_elsewhere_are_mentioned() -> None:
    # The packing and batching on the consumer's thread are the bottleneck, while 24
    # reader threads compete with it for the cores and the GIL.
    figures = text_pipeline(
        parallelism=THREADS_24,
        source={"wait": 5.0, "cpu": 5.0},
        tokenize={"wait": 5.0, "cpu": 98.0},
    )
    stages = tuple(
        dataclasses.replace(s, wait_percent=80.0) if s.id == BATCH else s for s in figures.stages
    )
    stats = dataclasses.replace(figures, stages=stages)
    assert stats.bottleneck is not None and stats.bottleneck.id == BATCH
    assert stats.recommendation == "processes"
    assert (
        "Stage 3 runs 24 threads on 2 usable cores: unless they wait for I/O, fewer "
        "(ReadOptions(num_threads=...)) would leave the cores and the GIL to the rest."
    ) in stats.advice()
