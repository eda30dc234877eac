"""`chute.AUTOTUNE`: settings chosen at run time from the consumer's measured rate.

`ReadOptions(num_threads=AUTOTUNE, prefetch_buffer_size=AUTOTUNE)` (the defaults) and
`MultiprocessingOptions(num_workers=AUTOTUNE)` (what `mp_prefetch()` without options uses)
leave a setting to a `HillClimb`: it measures the rate at which the consumer takes
elements (elements per wall-clock second, so a slow consumer counts), moves the setting
one step, keeps the step while the rate rises by more than `GAIN`, and otherwise goes
back and settles. A fall of the settled rate by more than `RETUNE_DROP` starts a new
climb. Each decision, with the rates that made it, is kept as a `Decision`: the engine
hands them to whoever asks through `DatasetIterator.tuning()` (the debug summary does).

Bounds come from the machine (`_src/core/machine.py`): threads at most
`MAX_THREADS` and never more elements computed ahead than `memory_budget()` bytes of
arrays hold; workers at most the usable cores and the memory they would take.

Only scheduling is tuned: which thread or process computes element `i`, and how far
ahead. Element `i` is always `ds[i]`, and the state is the reader's position, so the
output and the states are those of any fixed setting.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from chute._src.core.machine import process_queued_seconds, usable_cores
from chute._src.core.tuning import AUTOTUNE, Autotune, Decision, Tuning, is_autotune

GAIN = 0.10
"""A step is kept when it raises the consumer's rate by more than this fraction."""
NOISE_FACTOR = 1.5
"""...and by more than this many times the measured noise of one window's rate."""
SATURATED = 0.9
"""CPU use (the share of the usable cores the process keeps busy) at which a climb of
threads stops going up: more threads cannot add CPU."""
QUEUED = 0.25
"""...and the share of the window that the threads spend runnable but waiting for a CPU
(Linux `schedstat`) at which it stops too: on a machine shared with other processes the
CPU is the limit although this process does not use all of it."""
KEEP_FEWER = 0.04
"""A step down (fewer threads or workers) is kept when it loses at most this fraction."""
LINEAR = 0.75
"""A step up whose rate grows by this share of the growth of the value (4 threads giving
at least 1.75 times the rate of 2) jumps over the next value: latency-bound reads reach
their many threads in fewer windows."""
RETUNE_DROP = 0.35
"""A settled rate that falls by more than this fraction starts a new climb."""
RECLIMB_S = 30.0
"""A settled tuner climbs again after this long: the machine's load, or the pipeline's
work, may have changed in a way the settled rate cannot show (fewer workers cannot
tell that more would now pay)."""
WINDOW_S = 0.3
"""Each setting is measured over at least this long (after `SETTLE_S` to take effect)."""
SETTLE_S = 0.05
WINDOW_ELEMENTS = 128
"""...and over at least this many elements or twice that long: a consumer that takes
batches takes elements in bursts, which a short window counts unevenly."""
MAX_THREADS = 64
"""The most threads AUTOTUNE gives a reader (latency-bound reads want many)."""


class HillClimb:
    """Chooses one of `values` (increasing) from the consumer's measured rate.

    Call `observe(elements)` each time the consumer has taken `elements` more; it returns
    the value to use from now on (the same one while measuring). Each window's rate, with
    the process's CPU use, goes to `measured`, the climb's step, which tests call with given rates.

    The climb: measure the starting value over two windows and count the better one (the
    other may include the start-up, or lose its CPU to another process), try the next larger one while each raises the rate clearly,
    by more than `GAIN` and more than `NOISE_FACTOR` times the noise measured so far (a
    step that does not is measured once more and counts the mean of both windows); a
    larger value that is not clearly better is left and the climb goes back. No larger
    value is tried while the process already keeps `SATURATED` of the usable cores busy,
    or its threads wait for a CPU `QUEUED` of the time (more threads cannot add CPU). If the first step up did not pay, try smaller values
    while each loses at most `KEEP_FEWER`; then settle on the best. A settled rate that
    falls by `RETUNE_DROP` two windows in a row, or `RECLIMB_S` seconds settled, starts a new climb from where
    it is.
    """

    def __init__(
        self,
        setting: str,
        values: Sequence[int],
        start: int,
        tuning: Tuning,
        unit: str,
        *,
        up_only: bool = False,
        down_only: bool = False,
        watch_cpu: bool = False,
    ) -> None:
        if not values or list(values) != sorted(set(values)):
            raise ValueError(f"HillClimb values={values!r} must be increasing and non-empty.")
        self.setting = setting
        self.values = list(values)
        self._unit = unit
        self._up_only, self._down_only = up_only, down_only
        self._cores = usable_cores() if watch_cpu else 0
        self._i = min(range(len(self.values)), key=lambda k: abs(self.values[k] - start))
        self._tuning = tuning
        self._spreads: list[float] = []
        self._new_climb()
        self._settled_rate: float | None = None
        self._settled_at = 0.0
        self._fell = False  # the last settled window's rate fell by RETUNE_DROP
        self._reset_window()
        tuning.note(setting, self.value, f"start ({self._start_reason()})")

    def _new_climb(self) -> None:
        self._rates: dict[int, float] = {}  # index -> measured rate in this climb
        self._first_try: dict[int, float] = {}  # index -> the first of two windows
        self._phase = "up"
        self._best = self._i
        self._skipped: int | None = None  # a value jumped over, measured if the jump fails

    def _start_reason(self) -> str:
        if len(self.values) == 1:
            return "the only value the machine allows"
        return f"choices {self.values[0]}..{self.values[-1]}"

    @property
    def value(self) -> int:
        return self.values[self._i]

    @property
    def settled(self) -> bool:
        return self._settled_rate is not None

    @property
    def noise(self) -> float:
        """The relative noise of one window's rate: the median, over the values measured
        twice in a row (every climb's start, steps measured again), of how far the two
        windows' rates differ, as a share of their mean."""
        if not self._spreads:
            return 0.0
        ordered = sorted(self._spreads[-9:])
        return ordered[len(ordered) // 2]

    def needed_gain(self) -> float:
        """The fraction by which a larger value must raise the rate to be kept."""
        return min(1.0, max(GAIN, NOISE_FACTOR * self.noise))

    def _reset_window(self) -> None:
        self._t0 = time.monotonic()
        self._count = 0
        self._measuring_since: float | None = None
        self._cpu0 = 0.0
        self._queued0: float | None = None

    def observe(self, elements: int) -> int:
        now = time.monotonic()
        if self._measuring_since is None:
            if now - self._t0 < SETTLE_S:
                return self.value
            self._count = 0
            if self._cores:
                # The /proc reads may wait for the GIL: before the clocks, read together.
                self._queued0 = process_queued_seconds()
                now = time.monotonic()
                self._cpu0 = time.process_time()
            self._measuring_since = now
            return self.value
        self._count += elements
        elapsed = now - self._measuring_since
        enough = self._count >= WINDOW_ELEMENTS or elapsed >= 2 * WINDOW_S
        if elapsed < WINDOW_S or not enough:
            return self.value
        rate = self._count / elapsed
        cpu = queued = None
        if self._cores:
            cpu = (time.process_time() - self._cpu0) / elapsed / self._cores
            now_queued = process_queued_seconds()
            if now_queued is not None and self._queued0 is not None:
                # per thread computing (the value) and the consumer's
                queued = max(0.0, now_queued - self._queued0) / elapsed / (self.value + 1)
        self._reset_window()
        return self.measured(rate, cpu=cpu, queued=queued)

    def measured(
        self, rate: float, *, cpu: float | None = None, queued: float | None = None
    ) -> int:
        """One window's step: the consumer took `rate` elements/s with the current value,
        the process kept `cpu` of the usable cores busy and its threads waited for a CPU
        `queued` of the window each (None: not watched). Returns the value to use next."""
        busy = None
        if cpu is not None and cpu >= SATURATED:
            busy = f"{cpu:.0%} of {self._cores} cores busy"
        elif queued is not None and queued >= QUEUED:
            busy = f"threads waiting for a CPU {queued:.0%} of the time"
        if self._settled_rate is not None:
            self._watch(rate, busy)
        else:
            self._step(rate, busy)
        return self.value

    def _note_noise(self, first: float, second: float) -> None:
        self._spreads.append(abs(first - second) / max(1e-9, (first + second) / 2))

    def _fmt(self, rate: float) -> str:
        return f"{rate:,.0f} {self._unit}/s"

    def _step(self, rate: float, cpu_bound: str | None) -> None:
        i = self._i
        saturated = cpu_bound is not None
        busy = f" with {cpu_bound}" if cpu_bound else ""
        if not self._rates:  # the first measurement of a climb, taken over two windows
            if i not in self._first_try:
                self._first_try[i] = rate
                return
            # The better window: a step up must beat the base at its best, not a window
            # that lost the CPU to another process.
            first = self._first_try.pop(i)
            self._note_noise(first, rate)
            rate = max(rate, first)
            self._rates[i] = rate
            up = not self._down_only and i + 1 < len(self.values)
            down = not self._up_only and i > 0
            if up and not saturated:
                self._move(i + 1, "up", f"{self.values[i]} gave {self._fmt(rate)}: trying more")
            elif down:
                self._move(
                    i - 1, "down", f"{self.values[i]} gave {self._fmt(rate)}{busy}: trying fewer"
                )
            else:
                self._settle()
            return
        best_rate = self._rates[self._best]
        need = self.needed_gain()
        if self._phase == "up":
            if rate <= best_rate * (1 + need) and i not in self._first_try:
                # One more window before giving up: on a shared machine one window can
                # lose its CPU to another process.
                self._first_try[i] = rate
                return
            if i in self._first_try:  # the mean of both windows: the max would favour steps
                self._note_noise(self._first_try[i], rate)
                rate = (rate + self._first_try[i]) / 2
            self._rates[i] = rate
            if rate > best_rate * (1 + need):
                base = self.values[self._best]
                linear = base > 0 and rate >= best_rate * (1 + LINEAR * (self.values[i] / base - 1))
                self._best = i
                nxt = i + 2 if linear and i + 2 < len(self.values) else i + 1
                if i + 1 < len(self.values) and i + 1 not in self._rates and not saturated:
                    self._skipped = i + 1 if nxt == i + 2 else None
                    jump = " (near linear: skipping one)" if self._skipped is not None else ""
                    self._move(
                        nxt, "up", f"{self.values[i]} gave {self._fmt(rate)}: trying more{jump}"
                    )
                    return
            elif self._skipped is not None and self._skipped not in self._rates:
                skipped, self._skipped = self._skipped, None
                self._move(
                    skipped,
                    "up",
                    f"{self.values[i]} gave {self._fmt(rate)}, not > {need:.0%} more than "
                    f"{self.values[self._best]}: trying the value jumped over",
                )
                return
            elif not self._up_only and len(self._rates) == 2 and self._best > 0:
                # the first step up did not pay: maybe fewer do as well
                self._move(
                    self._best - 1,
                    "down",
                    f"{self.values[i]} gave {self._fmt(rate)}, not > {need:.0%} more than "
                    f"{self.values[self._best]}: trying fewer",
                )
                return
        else:
            fastest = max(self._rates.values())  # not compounded step after step
            self._rates[i] = rate
            if rate >= fastest * (1 - KEEP_FEWER):
                self._best = i
                if i > 0:
                    self._move(
                        i - 1, "down", f"{self.values[i]} gave {self._fmt(rate)}: trying fewer"
                    )
                    return
        self._settle(busy)

    def _move(self, i: int, phase: str, reason: str) -> None:
        self._i, self._phase = i, phase
        self._tuning.note(self.setting, self.value, reason)

    def _settle(self, busy: str = "") -> None:
        self._i = self._best
        best_rate = self._rates[self._best]
        self._settled_rate = best_rate
        self._settled_at = time.monotonic()
        self._fell = False
        tried = ", ".join(
            f"{self.values[k]}: {self._fmt(r)}" for k, r in sorted(self._rates.items())
        )
        self._tuning.note(
            self.setting,
            self.value,
            f"settled; measured {tried}{busy} (a larger value is kept for > "
            f"{self.needed_gain():.0%} more, the noise {self.noise:.0%} allowing; fewer for "
            f"< {KEEP_FEWER:.0%} less)",
        )

    def _watch(self, rate: float, cpu_bound: str | None) -> None:
        settled = self._settled_rate or 0.0
        fell = rate < settled * (1 - RETUNE_DROP)
        dropped = fell and self._fell  # two windows in a row: one can lose its CPU
        self._fell = fell
        if fell and not dropped:
            return
        if dropped or time.monotonic() - self._settled_at > RECLIMB_S:
            why = (
                f"rate fell to {self._fmt(rate)} from {self._fmt(settled)}"
                if dropped
                else f"settled for {RECLIMB_S:.0f} s"
            )
            self._tuning.note(self.setting, self.value, f"{why}: tuning again")
            self._settled_rate = None
            self._new_climb()
            self._step(rate, cpu_bound)
        else:
            # follow slow drifts so that a later drop is measured against the present
            self._settled_rate = 0.8 * settled + 0.2 * rate


__all__ = [
    "AUTOTUNE",
    "Autotune",
    "Decision",
    "HillClimb",
    "Tuning",
    "is_autotune",
]
