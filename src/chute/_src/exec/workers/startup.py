"""Threads of the consumer's process that compute elements while workers start (see
`feeding.WorkerChunks`), so that the reader's own thread (the consumer's, or a prefetch
thread's), which talks to the workers, gives them the elements after these as soon as
they are started.

- `compute_beside`: the first element of an iterator, which the consumer computes itself
  while its workers start; its value, or what it raised, as if computed in place.
- `StartupHelper`: the elements after it while the workers of a program's first pool wait
  for the forkserver. Elements that raise (or run on past the workers' start by more than
  `grace_s`: one may hang) come back as None and are left to the workers, which report a
  failure or a stall as they always do.

  The helper computes runs of consecutive elements, as the workers compute chunks: one
  element at a time, a row of text costs 2.5-3.5 times what it costs in a run of 512 (the
  source reads each record alone, and every stage is called once per element). A run is
  sized to take about `target_s`, growing at most 4-fold from the last, from the time per
  element of the last computation here.

  A run is started here only when it is likely to be done before the workers start: when
  the forkserver has been starting for at least `LEAD` times as long as the run should
  take (the server's start is unknown, ~0.2 s or the seconds of a main script importing
  torch; the longer it has run, the longer it likely runs on). Until then the helper
  waits, and elements the workers start first are theirs. A run still going when they
  start takes a core from them for little: 2 workers deliver in pairs, and in a fresh
  process the 10th batch of images (64 per element, ~0.17 s each) came no sooner for the
  one the helper computed (first 10 batches / steady rate 0.70 with it, 0.76 without, in
  `benchmarks/bench_rampup.py`'s A/B).

The consumer waits for each answer, so the pipeline is never used by two threads at once.
Readers advanced on threads of their own (two `prefetch(n)` branches under one
`mp_prefetch`) share the helper: it computes one run at a time, each answered to its caller.

Both run on daemon threads of their own, not `threadpool.ComputePool`'s: an element that
hangs is abandoned to its thread (the workers compute it instead), and a pool's thread
would hold up the interpreter's exit until it returned.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

# How long an element computed here may still run once the workers are started, before it
# is given to them instead (the thread is then abandoned to finish it on its own).
GRACE_S = 1.0
# A run of elements is started here once the forkserver has been starting for LEAD times
# as long as it should take (see the module's docstring).
LEAD = 2.0
_POLL_S = 0.005  # how often a wait looks at whether the workers are started


def compute_beside(
    fn: Callable[[], Any], started: Callable[[], bool], on_started: Callable[[], None]
) -> Any:
    """`fn()` computed on a thread of its own while this one waits, calling `on_started`
    (here) as soon as `started()` is true: workers that start meanwhile are given work
    instead of waiting for `fn`. Returns what `fn` returned, or raises what it raised."""
    got: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            got.append((True, fn()))
        except BaseException as e:  # raised on the consumer's thread, as in place
            got.append((False, e))
        finally:
            done.set()

    threading.Thread(target=run, name="chute-first-element", daemon=True).start()
    told = False
    while not done.wait(None if told else _POLL_S):
        if started():
            told = True
            on_started()
    ok, value = got.pop()  # (not kept in the list: a cycle through the traceback)
    if not ok:
        raise value
    return value


class StartupHelper:
    def __init__(
        self,
        started: Callable[[], bool],
        starting_s: Callable[[], float],
        target_s: float,
        grace_s: float = GRACE_S,
    ) -> None:
        """`started()`: whether the workers are started; `starting_s()`: how long the
        forkserver they wait for has been starting; `target_s`: how long a run of
        elements computed here should take."""
        self._started = started
        self._starting_s = starting_s
        self._target_s = target_s
        self._grace_s = grace_s
        self.element_s = 0.0  # time per element of the last computation in this process
        self._last_count = 1  # how many elements it computed
        self._ask: queue.SimpleQueue[tuple[int, Callable[[], Any], int] | None] = (
            queue.SimpleQueue()
        )
        self._got: queue.SimpleQueue[tuple[int, bool, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._one_run = threading.Lock()  # one caller's run at a time (see the docstring)
        self._closed = False
        self.stuck = False  # a run was given up on: ask nothing more

    def measured(self, seconds: float, count: int) -> None:
        """`count` elements were computed in this process in `seconds`."""
        self.element_s = seconds / count
        self._last_count = count

    def size(self, most: int) -> int:
        """How many elements to compute here next, at most `most`: as many as take about
        `target_s`, at most 4 times the last count, and only as many as are likely done
        before the workers start (see the module's docstring); waits until at least one
        is; 0 if the workers are started first."""
        while True:
            k = min(most, 4 * self._last_count)
            if self.element_s > 0:
                timed = max(1, int(self._target_s / self.element_s))
                in_time = int(self._starting_s() / (LEAD * self.element_s))
                k = min(k, timed, in_time)
            if k >= 1:
                return k
            if self._started():
                return 0
            time.sleep(_POLL_S)

    def compute(
        self, fn: Callable[[], Any], count: int, on_started: Callable[[], None] | None = None
    ) -> Any | None:
        """`fn()`, which computes `count` elements, on the helper's thread; None if it
        raised, or if it had not finished `grace_s` after the workers were started.
        `on_started` is called (on this thread) as soon as the workers are seen started
        while `fn` runs, so that they are given the elements after these meanwhile.
        None at once once closed."""
        with self._one_run:
            if self._closed:
                return None
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="chute-startup", daemon=True)
                self._thread.start()
            self._seq += 1
            seq = self._seq
            self._ask.put((seq, fn, count))
            deadline: float | None = None
            while True:
                try:
                    got, ok, value = self._got.get(timeout=_POLL_S)
                except queue.Empty:
                    if deadline is None and self._started():
                        deadline = time.monotonic() + self._grace_s
                        if on_started is not None:
                            on_started()
                    if deadline is not None and time.monotonic() > deadline:
                        self.stuck = True
                        return None
                    continue
                if got == seq:
                    return value if ok else None

    def close(self) -> None:
        """Lets the thread end once it has finished what it computes (at once if idle).
        Idempotent, and never waits: a caller on another thread still waiting for a run
        gets its answer, or gives up at its deadline."""
        self._closed = True
        self._ask.put(None)  # (`_thread` stays set: `compute` never starts a second one)

    def _run(self) -> None:
        while (item := self._ask.get()) is not None:
            seq, fn, count = item
            begun = time.perf_counter()
            try:
                answer = (seq, True, fn())
            except BaseException:  # the workers compute it again and report what it raises
                answer = (seq, False, None)
            self.measured(time.perf_counter() - begun, count)
            self._got.put(answer)
