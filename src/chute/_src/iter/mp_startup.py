"""Threads of the consumer's process that compute elements while workers start (see
`mp_prefetch.WorkerChunks`), so that the consumer's own thread, which alone talks to the
workers, gives them the elements after these as soon as they are started.

- `compute_beside`: the first element of an iterator, which the consumer computes itself
  while its workers start; its value, or what it raised, as if computed in place.
- `StartupHelper`: the elements after it while the workers of a program's first pool wait
  for the forkserver. An element that raises (or runs on past the workers' start by more
  than `grace_s`: it may hang) comes back as None and is left to the workers, which
  report a failure or a stall as they always do.

  An element is started here only when it is likely to be done before the workers start:
  when the forkserver has been starting for at least `LEAD` times as long as the last
  element computed here took (the server's start is unknown, ~0.2 s or the seconds of a
  main script importing torch; the longer it has run, the longer it likely runs on).
  Until then the helper waits, and an element the workers start first is theirs. One
  still running when they start takes a core from them for little: 2 workers deliver in
  pairs, and in a fresh process the 10th batch of images (64 per element, ~0.17 s each)
  came no sooner for the one the helper computed (first 10 batches / steady rate 0.70
  with it, 0.76 without, in `benchmarks/bench_rampup.py`'s A/B).

The consumer waits for each answer, so the pipeline is never used by two threads at once.
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
# An element is started here once the forkserver has been starting for LEAD times as long
# as the last one took (see the module's docstring).
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
        grace_s: float = GRACE_S,
    ) -> None:
        """`started()`: whether the workers are started; `starting_s()`: how long the
        forkserver they wait for has been starting."""
        self._started = started
        self._starting_s = starting_s
        self._grace_s = grace_s
        self.last_s = 0.0  # how long the last element computed in this process took
        self._ask: queue.SimpleQueue[tuple[int, Callable[[], Any]] | None] = queue.SimpleQueue()
        self._got: queue.SimpleQueue[tuple[int, bool, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self.stuck = False  # an element was given up on: ask nothing more

    def compute(
        self, fn: Callable[[], Any], on_started: Callable[[], None] | None = None
    ) -> Any | None:
        """`fn()` computed on the helper's thread; None if the workers were started before
        it was likely to be done (see the module's docstring), if it raised, or if it had
        not finished `grace_s` after the workers were started. `on_started` is called (on
        this thread) as soon as the workers are seen started while `fn` runs, so that they
        are given the elements after it meanwhile."""
        while LEAD * self.last_s > self._starting_s():
            if self._started():
                return None
            time.sleep(_POLL_S)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chute-startup", daemon=True)
            self._thread.start()
        self._seq += 1
        seq = self._seq
        self._ask.put((seq, fn))
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
        """Lets the thread end once it has finished what it computes (at once if idle)."""
        if self._thread is not None:
            self._ask.put(None)
            self._thread = None

    def _run(self) -> None:
        while (item := self._ask.get()) is not None:
            seq, fn = item
            begun = time.perf_counter()
            try:
                answer = (seq, True, fn())
            except BaseException:  # the workers compute it again and report what it raises
                answer = (seq, False, None)
            self.last_s = time.perf_counter() - begun
            self._got.put(answer)
