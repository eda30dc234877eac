"""`chute.AUTOTUNE`: settings chosen at run time, which change scheduling only.

The elements and the states of an autotuned pipeline are those of the same pipeline with
fixed settings, while the tuner changes its settings mid-run; a state taken under one
restores under the other. What the tuner chose, and why, is in `chute.stats(it)` and the
execution summary.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute.testing import assert_equal_output_after_checkpoint
from mp_pipelines import double, jitter, keep


def sleepy(x: int) -> int:
    time.sleep(0.001)  # a read that waits, as object storage does
    return x + 1


def read_pipeline(options: chute.ReadOptions, n: int = 100_000) -> chute.IterDataset[Any]:
    return (
        chute.MapDataset.range(n)
        .seed(3)
        .shuffle()
        .map(sleepy)
        .to_iter_dataset(options)
        .filter(keep)
        .batch(5)
    )


def tuned(it: Any) -> dict[str, int]:
    """The settings AUTOTUNE holds now, over every tuned stage of `it`."""
    out: dict[str, int] = {}
    for stage in chute.stats(it).tuned:
        out.update(stage.current)
    return out


def decisions(it: Any, setting: str) -> list[Any]:
    return [d for t in chute.stats(it).tuned for d in t.decisions if d.setting == setting]


def test_autotune_is_the_default_of_read_options() -> None:
    options = chute.ReadOptions()
    assert options.num_threads is chute.AUTOTUNE
    assert options.prefetch_buffer_size is chute.AUTOTUNE
    assert repr(chute.AUTOTUNE) == "AUTOTUNE"
    assert "num_threads=AUTOTUNE" in repr(options)
    assert chute.MultiprocessingOptions(num_workers=chute.AUTOTUNE).num_workers is chute.AUTOTUNE
    # Grain's explicit options object keeps Grain's default: no workers.
    assert chute.MultiprocessingOptions().num_workers == 0


@pytest.mark.parametrize("value", [-1, 1.5, "auto", True, None])
def test_bad_values_name_autotune_as_an_option(value: Any) -> None:
    with pytest.raises(ValueError, match=r"num_threads=.* is invalid: .*chute\.AUTOTUNE"):
        chute.ReadOptions(num_threads=value)
    with pytest.raises(ValueError, match=r"num_workers=.* is invalid: .*chute\.AUTOTUNE"):
        chute.MultiprocessingOptions(num_workers=value)


def test_output_and_states_equal_fixed_settings_while_the_tuner_moves(debug_mode: None) -> None:
    ds = read_pipeline(chute.ReadOptions())
    fixed = read_pipeline(chute.ReadOptions(num_threads=16, prefetch_buffer_size=64))
    it = iter(ds)
    got, states = [], []
    deadline = time.monotonic() + 20
    # Until the thread count has moved at least twice (or 1.5 s, at the least), so that
    # elements and states are taken across changes of the setting.
    t0 = time.monotonic()
    while len(decisions(it, "num_threads")) < 3 or time.monotonic() - t0 < 1.0:
        assert time.monotonic() < deadline, chute.stats(it).summary()
        for _ in range(20):
            states.append(json.dumps(it.get_state()))
            got.append(next(it).tolist())
    it.close()
    assert len({d.value for d in decisions(it, "num_threads")}) >= 2

    ref = iter(fixed)
    for k, (batch, state) in enumerate(zip(got, states)):
        assert json.dumps(ref.get_state()) == state, f"state before batch {k}"
        assert next(ref).tolist() == batch, f"batch {k}"

    # A state taken mid-run under AUTOTUNE restores under fixed settings, and back.
    middle = len(got) // 2
    into_fixed = iter(fixed)
    into_fixed.set_state(json.loads(states[middle]))
    assert [next(into_fixed).tolist() for _ in range(len(got) - middle)] == got[middle:]
    into_tuned = iter(read_pipeline(chute.ReadOptions()))
    fixed_it = iter(read_pipeline(chute.ReadOptions(num_threads=4, prefetch_buffer_size=7)))
    for _ in range(middle):
        next(fixed_it)
    into_tuned.set_state(fixed_it.get_state())
    assert [next(into_tuned).tolist() for _ in range(len(got) - middle)] == got[middle:]
    into_tuned.close()


@pytest.mark.parametrize(
    "options",
    [
        chute.ReadOptions(),
        chute.ReadOptions(num_threads=chute.AUTOTUNE, prefetch_buffer_size=3),
        chute.ReadOptions(num_threads=2, prefetch_buffer_size=chute.AUTOTUNE),
    ],
)
def test_restores_at_every_step_into_fixed_settings(options: chute.ReadOptions) -> None:
    def small(opts: chute.ReadOptions) -> chute.IterDataset[Any]:
        return (
            chute.MapDataset.range(90)
            .seed(1)
            .shuffle()
            .random_map(jitter)
            .to_iter_dataset(opts)
            .filter(keep)
            .batch(4)
        )

    assert_equal_output_after_checkpoint(small(options), restore_into=small(chute.ReadOptions(0)))
    assert_equal_output_after_checkpoint(
        small(chute.ReadOptions(3, 5)), restore_into=small(options)
    )


def test_slow_reads_get_many_threads(debug_mode: None) -> None:
    """Reads that wait (5 ms each, no CPU) are computed by many threads: the climb goes on
    while doubling the threads raises the rate, and says why it stopped."""

    it = iter(chute.MapDataset.range(1_000_000).map(sleep_5ms).to_iter_dataset(chute.ReadOptions()))
    deadline = time.monotonic() + 30
    while not any("settled" in d.reason for d in decisions(it, "num_threads")):
        assert time.monotonic() < deadline, chute.stats(it).summary()
        for _ in range(50):
            next(it)
    assert tuned(it)["num_threads"] >= 8, chute.stats(it).summary()
    # Where the climb starts (16 threads for elements that wait) is decided from one
    # chunk's timing, which a busy machine can blur (the rule itself is tested on given
    # figures below), and so is whether a near-linear gain skips a step (from 2: 4, then
    # 16); wherever it started, the climb reached 16 threads or more (in CI under load it
    # went past the first three decisions before it did, to 32).
    assert max(d.value for d in decisions(it, "num_threads")) >= 16, chute.stats(it).summary()
    summary = chute.stats(it).summary()
    it.close()
    assert "chute.AUTOTUNE chose" in summary
    assert "num_threads = " in summary and "settled; measured" in summary
    assert "prefetch_buffer_size = " in summary


@pytest.mark.parametrize(
    ("shares", "last", "verdict"),
    [
        ((0.05, 0.1), False, True),  # a read: idle thread, idle process: start at 16
        ((0.9, 0.0), False, False),  # computing: start at the cores
        ((0.5, 0.6), False, False),  # computing, taking turns at the GIL
        ((0.1, 0.8), False, None),  # idle while another thread computed: a GIL wait?
        ((0.1, 0.8), True, False),  # ... and still unclear at the last chunk: the cores
        (None, False, False),  # no figures (0 wall time)
    ],
)
def test_the_start_of_the_thread_climb_on_given_figures(
    shares: tuple[float, float] | None, last: bool, verdict: bool | None
) -> None:
    from chute._src.exec.executors import start_verdict

    assert start_verdict(shares, last) is verdict


def sleep_5ms(x: int) -> int:
    time.sleep(0.005)
    return x


def busy_5ms(x: int) -> int:
    # As long as a thread may wait for the GIL (the 5 ms switch interval) while another
    # thread holds it: computing, it measures at least half its time on a CPU.
    end = time.thread_time() + 0.005
    while time.thread_time() < end:
        pass
    return x


def test_computing_elements_start_the_climb_at_the_cores(debug_mode: None) -> None:
    """Elements that compute (CPU, not waiting) start the thread climb at the usable cores
    (at most 4): the start at 16 threads is for elements that mostly wait."""
    it = iter(chute.MapDataset.range(10_000).map(busy_5ms).to_iter_dataset(chute.ReadOptions()))
    for _ in range(20):
        next(it)
    first = decisions(it, "num_threads")[0]
    it.close()
    # (CI once saw a 5 ms computing element's thread idle 87% of a chunk: the chunk's
    # wall clock was read before, and the others' CPU after, a /proc read that waited for
    # the GIL; test_a_chunk_taking_turns_at_the_gil_is_all_accounted_for.)
    cores = min(len(os.sched_getaffinity(0)), 4)
    assert first.value == cores and first.reason.startswith("start"), first


class Spin:
    """Holds the GIL (pure Python) on its own thread until stopped."""

    def __init__(self) -> None:
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        x = 0
        while not self.stop:
            x += 1

    def __enter__(self) -> Spin:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop = True
        self.thread.join()


def test_a_chunk_taking_turns_at_the_gil_is_all_accounted_for() -> None:
    """A chunk of pure Python while another thread computes: its own CPU (and waits for a
    CPU) and the other threads' cover its wall-clock time, so AUTOTUNE does not take its
    waits for the GIL for reads (16 threads for CPU-bound work, 255 elements started before
    the third came out)."""
    from chute._src.exec.executors import _timed_getitems

    ds = chute.MapDataset.range(100).map(busy_5ms)
    with Spin():
        for i in range(10):
            _, wall, cpu, queued, others = _timed_getitems(ds, np.arange(i, i + 4), True)
            assert (cpu + queued + others) / wall > 0.8, (wall, cpu, queued, others)


class CountingBusy:
    """~20 ms of CPU per element, counting the elements started."""

    def __init__(self) -> None:
        self.started = 0

    def __call__(self, x: int) -> int:
        self.started += 1
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        return x


def test_slow_elements_after_the_first_come_in_small_chunks() -> None:
    """An element that takes long (a batch of images) is not computed in a chunk of many
    before the second element is measured: the first element's time sizes the next chunks.
    (Before, the second chunk held 32 elements, and the third element waited for all of
    them: 11 s for batches of 64 images.)"""
    fn = CountingBusy()
    it = iter(chute.MapDataset.range(1000).map(fn).to_iter_dataset())
    for _ in range(3):
        next(it)
    started = fn.started
    it.close()
    # A second chunk of 32 would have started 33 before the third came out; chunks of one
    # start only those the threads take up while the consumer waits for its GIL turn.
    assert started < 33, started


def test_fixed_settings_are_not_tuned(debug_mode: None) -> None:
    it = iter(chute.MapDataset.range(50).to_iter_dataset(chute.ReadOptions(2, 10)))
    list(it)
    assert chute.stats(it).tuned == ()
    assert "AUTOTUNE" not in chute.stats(it).summary()


def mp_pipeline(options: chute.MultiprocessingOptions | str | None) -> chute.IterDataset[Any]:
    """With `options`, with `mp_prefetch()`'s defaults ("default") or without the stage."""
    ds = (
        chute.MapDataset.range(150)
        .seed(7)
        .shuffle()
        .map(double)
        .random_map(jitter)
        .to_iter_dataset()
        .filter(keep)
        .batch(3)
    )
    if options == "default":
        return ds.mp_prefetch()
    return ds.mp_prefetch(options) if isinstance(options, chute.MultiprocessingOptions) else ds


def test_workers_autotuned_from_the_machine(debug_mode: None) -> None:
    """`mp_prefetch()` without options: as many workers as usable cores (the memory here
    holds them), the same elements and states as no workers at all."""
    it = iter(mp_pipeline("default"))
    got = list(it)
    assert got and all(
        a.tolist() == b.tolist() for a, b in zip(got, mp_pipeline(chute.MultiprocessingOptions(0)))
    )
    first = decisions(it, "num_workers")[0]
    assert first.value == len(os.sched_getaffinity(0))
    assert "usable cores" in first.reason
    assert "num_workers" in chute.stats(it).summary()


def test_worker_states_move_between_autotune_and_fixed_counts() -> None:
    tuned_ds = mp_pipeline(chute.MultiprocessingOptions(num_workers=chute.AUTOTUNE))
    for other in (None, chute.MultiprocessingOptions(num_workers=1)):
        assert_equal_output_after_checkpoint(
            tuned_ds, restore_into=mp_pipeline(other), steps=[0, 4, 17]
        )
        assert_equal_output_after_checkpoint(
            mp_pipeline(other), restore_into=tuned_ds, steps=[3, 30]
        )


DOC = Path(__file__).resolve().parents[2] / "docs" / "performance.md"


def test_the_example_of_performance_md_runs() -> None:
    import re

    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/performance.md has no example"
    try:
        for block in blocks:
            exec(compile(block, str(DOC), "exec"), {"__name__": "performance_md"})
    finally:
        chute.config.update("py_debug_mode", False)
        chute.config.update("py_debug_summary_interval_s", 60.0)


# -- the climb's rules, step by step with given rates (no timing) --------------------------


def climb(values: list[int], start: int, rates: dict[int, list[float]], **kw: Any) -> Any:
    """A HillClimb fed `rates[value]` (one window each, in turn) until it settles."""
    from chute._src.exec.autotune import HillClimb, Tuning

    tuning = Tuning()
    cpu = kw.pop("cpu", None)
    c = HillClimb("num_threads", values, start, tuning, "elements", **kw)
    seen: dict[int, int] = {}
    for _ in range(100):
        if c.settled:
            return c, tuning
        v = c.value
        k = seen.get(v, 0)
        seen[v] = k + 1
        c.measured(rates[v][min(k, len(rates[v]) - 1)], cpu=cpu)
    raise AssertionError(f"did not settle: {[str(d) for d in tuning.decisions]}")


def test_a_step_within_the_noise_is_not_kept() -> None:
    """Two windows of 2 threads differ by 40 %: a step to 4 that gains 30 % is noise, and
    the climb goes back (then keeps 1 thread only if it loses at most 4 %)."""
    from chute._src.exec.autotune import HillClimb, Tuning

    rates = {1: [300.0], 2: [400.0, 600.0], 4: [780.0, 780.0], 8: [2000.0]}
    c, tuning = climb([1, 2, 4, 8], 2, rates)
    assert c.value == 2, [str(d) for d in tuning.decisions]
    assert c.noise == pytest.approx(0.4)
    assert c.needed_gain() == pytest.approx(0.6)
    assert "not > 60% more than 2" in " ".join(d.reason for d in tuning.decisions)
    # the same gain on a quiet machine is kept
    quiet = {1: [300.0], 2: [600.0, 600.0], 4: [780.0], 8: [780.0, 780.0]}
    c, _ = climb([1, 2, 4, 8], 2, quiet)
    assert c.value == 4
    assert isinstance(c, HillClimb) and isinstance(tuning, Tuning)


def test_a_larger_value_that_is_not_better_is_left() -> None:
    """The climb steps back from a larger value that measures no better, both windows."""
    rates = {2: [100.0, 100.0], 4: [150.0], 8: [160.0, 155.0], 16: [1e6]}
    c, tuning = climb([2, 4, 8, 16], 2, rates)
    assert c.value == 4
    assert tuning.decisions[-1].value == 4 and "settled" in tuning.decisions[-1].reason


def test_the_base_counts_its_better_window() -> None:
    """A start measured over a window that lost its CPU (50) and a normal one (100): a step
    up must beat 100, not 50."""
    rates = {1: [90.0], 2: [50.0, 100.0], 4: [120.0, 120.0]}
    c, _ = climb([1, 2, 4], 2, rates)
    assert c.value == 2


def test_no_more_threads_while_the_cores_are_busy() -> None:
    """At 95 % of the usable cores the climb does not try more threads: it tries fewer."""
    rates = {1: [100.0], 2: [100.0, 100.0], 4: [1000.0]}
    c, tuning = climb([1, 2, 4], 2, rates, cpu=0.95)
    assert c.value == 1
    assert all(d.value != 4 for d in tuning.decisions)


def test_near_linear_steps_jump_and_measure_what_they_skipped() -> None:
    """4 threads giving twice the rate of 2 jumps to 16; 16 not paying, 8 is measured."""
    rates = {2: [100.0, 100.0], 4: [200.0], 8: [390.0], 16: [210.0, 210.0], 32: [1e6]}
    c, tuning = climb([2, 4, 8, 16, 32], 2, rates)
    tried = [d.value for d in tuning.decisions]
    assert tried[:3] == [2, 4, 16] and 8 in tried
    assert c.value == 8
    # and one that keeps paying ends at the top in fewer windows than values
    reads = {v: [100.0 * v, 100.0 * v] for v in (2, 4, 8, 16, 32, 64)}
    c, tuning = climb([2, 4, 8, 16, 32, 64], 2, reads)
    assert c.value == 64 and 8 not in [d.value for d in tuning.decisions]


def test_a_settled_climb_retunes_after_two_low_windows_only() -> None:
    rates = {1: [100.0], 2: [100.0, 100.0], 4: [100.0, 100.0]}
    c, tuning = climb([1, 2, 4], 2, rates)
    settled = len(tuning.decisions)
    c.measured(10.0)  # one window that lost the CPU
    assert c.settled and len(tuning.decisions) == settled
    c.measured(100.0)
    c.measured(10.0)
    c.measured(10.0)  # two in a row: the pipeline or the machine changed
    assert not c.settled
    assert "tuning again" in tuning.decisions[settled].reason


def test_the_buffer_climbs_only_while_it_pays(debug_mode: None) -> None:
    """A CPU-bound reader's buffer is tried larger once and left where it was when the
    rate does not rise (it was grown to 4096 elements, gigabytes of images, before)."""
    from chute._src.exec.autotune import HillClimb, Tuning

    tuning = Tuning()
    c = HillClimb("prefetch_buffer_size", [32, 64, 128], 32, tuning, "elements", up_only=True)
    for rate in (500.0, 520.0, 510.0, 505.0):
        c.measured(rate)
    assert c.settled and c.value == 32


def interleaved(parallelism: Any) -> chute.IterDataset[Any]:
    shards = [chute.MapDataset.range(100 * i, 100 * i + 37).map(sleepy) for i in range(12)]
    return chute.experimental.InterleaveIterDataset(
        shards, cycle_length=3, iter_buffer_size=4, parallelism=parallelism
    )


def test_interleave_parallelism_autotune_changes_neither_output_nor_state(
    debug_mode: None,
) -> None:
    """AUTOTUNE (the default) gives the elements and states of a fixed parallelism, and
    states move between them; what it chose is in the iterator's `tuning()`."""
    assert chute.experimental.InterleaveIterDataset([], cycle_length=1).parallelism is (
        chute.AUTOTUNE
    )
    fixed = list(interleaved(2))
    it = iter(interleaved(chute.AUTOTUNE))
    got = list(it)
    assert got == fixed
    assert "parallelism" in tuned(it)
    assert "parallelism = " in chute.stats(it).summary()
    assert_equal_output_after_checkpoint(
        interleaved(chute.AUTOTUNE), restore_into=interleaved(1), steps=[0, 5, 100, 300]
    )
    assert_equal_output_after_checkpoint(
        interleaved(7), restore_into=interleaved(chute.AUTOTUNE), steps=[3, 200]
    )


def test_no_more_threads_while_they_wait_for_a_cpu() -> None:
    """Threads runnable but waiting for a CPU (a machine shared with other processes) a
    third of the time: the CPU is the limit, more threads are not tried."""
    from chute._src.core.machine import process_queued_seconds
    from chute._src.exec.autotune import HillClimb, Tuning

    tuning = Tuning()
    c = HillClimb("num_threads", [1, 2, 4], 2, tuning, "elements")
    for rate in (100.0, 100.0):
        c.measured(rate, cpu=0.4, queued=0.33)
    assert c.value == 1 and "waiting for a CPU 33%" in tuning.decisions[-1].reason
    seconds = process_queued_seconds()
    assert seconds is None or seconds >= 0.0


class BatchedReads:
    """A source whose block reads each wait 20 ms, whatever their size (a round trip to
    a store, all of a block's reads in flight at once), counting the reads."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Any) -> list[int]:
        self.calls += 1
        time.sleep(0.02)
        return [int(i) for i in indices]


def test_elements_that_wait_are_read_in_large_chunks() -> None:
    """The first element's 20 ms were a wait, not work: a chunk of many such reads waits
    about as long, so it must not size the chunks down to one element (one round trip per
    element: 20x slower at 20 ms)."""
    src = BatchedReads(2048)
    opts = chute.ReadOptions(num_threads=2, prefetch_buffer_size=256)
    it = iter(chute.MapDataset.source(src).to_iter_dataset(opts))
    assert [next(it) for _ in range(1024)] == list(range(1024))
    it.close()
    # Chunks of one element would have made more than 1,024 reads.
    assert src.calls < 200
