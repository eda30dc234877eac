"""`chute.AUTOTUNE`: settings chosen at run time from the consumer's measured rate.

`ReadOptions(num_threads=AUTOTUNE, prefetch_buffer_size=AUTOTUNE)` (the defaults) and
`MultiprocessingOptions(num_workers=AUTOTUNE)` (what `mp_prefetch()` without options uses)
leave a setting to a `HillClimb`: it measures the rate at which the consumer takes
elements (elements per wall-clock second, so a slow consumer counts), moves the setting
one step, keeps the step while the rate rises by more than `GAIN`, and otherwise goes
back and settles. A fall of the settled rate by more than `RETUNE_DROP` starts a new
climb. Each decision, with the rates that made it, is kept as a `Decision`: the engine
hands them to whoever asks through `DatasetIterator.tuning()` (the debug summary does).

Bounds come from the machine (`usable_cores`, `available_memory`): threads at most
`MAX_THREADS` and never more elements computed ahead than `memory_budget()` bytes of
arrays hold; workers at most the usable cores and the memory they would take.

Only scheduling is tuned: which thread or process computes element `i`, and how far
ahead. Element `i` is always `ds[i]`, and the state is the reader's position, so the
output and the states are those of any fixed setting.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import time
from collections.abc import Sequence
from typing import Final, Literal, TypeAlias


class _Autotune(enum.Enum):
    AUTOTUNE = "AUTOTUNE"

    def __repr__(self) -> str:
        return "AUTOTUNE"


AUTOTUNE: Final = _Autotune.AUTOTUNE
"""Leave a setting to chute, tuned at run time (tf.data's `tf.data.AUTOTUNE`)."""

Autotune: TypeAlias = Literal[_Autotune.AUTOTUNE]
"""The type of `AUTOTUNE`, for annotations: `int | Autotune`."""

GAIN = 0.10
"""A step is kept when it raises the consumer's rate by more than this fraction."""
KEEP_FEWER = 0.04
"""A step down (fewer threads or workers) is kept when it loses at most this fraction."""
RETUNE_DROP = 0.35
"""A settled rate that falls by more than this fraction starts a new climb."""
RECLIMB_S = 30.0
"""A settled tuner climbs again after this long: the machine's load, or the pipeline's
work, may have changed in a way the settled rate cannot show (fewer workers cannot
tell that more would now pay)."""
WINDOW_S = 0.3
"""Each setting is measured over at least this long (after `SETTLE_S` to take effect)."""
SETTLE_S = 0.05
MAX_THREADS = 64
"""The most threads AUTOTUNE gives a reader (latency-bound reads want many)."""
MEMORY_SHARE = 0.25
"""The share of the available memory that AUTOTUNE's buffers may hold (tf.data: 0.5 of
the budget it is given)."""


def usable_cores() -> int:
    """The CPUs this process may run on (`os.sched_getaffinity`, a container's cpuset),
    else `os.cpu_count()`."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_memory() -> int:
    """Bytes of memory available without swapping (Linux `MemAvailable`, bounded by a
    cgroup's limit); else half the physical memory."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        try:
            available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
        except (ValueError, OSError, AttributeError):
            available = 4 << 30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            available = min(available, int(text))
    return available


def memory_budget() -> int:
    """Bytes of arrays AUTOTUNE lets a reader compute ahead: `MEMORY_SHARE` of the
    available memory, at least 64 MiB."""
    return max(64 << 20, int(available_memory() * MEMORY_SHARE))


def is_autotune(value: object) -> bool:
    return value is AUTOTUNE


@dataclasses.dataclass(frozen=True)
class Decision:
    """One choice of a tuner: the `setting` now has `value`, for `reason`."""

    at_s: float  # seconds since the tuner started
    setting: str
    value: int
    reason: str

    def __str__(self) -> str:
        return f"{self.at_s:6.2f} s  {self.setting} = {self.value}: {self.reason}"


class Tuning:
    """The decisions of the tuners of one iterator stage, oldest first (at most 50 kept:
    the first, then the latest)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.decisions: list[Decision] = []
        self.current: dict[str, int] = {}

    def note(self, setting: str, value: int, reason: str) -> None:
        self.current[setting] = value
        if len(self.decisions) >= 50:
            del self.decisions[10]
        self.decisions.append(Decision(time.monotonic() - self.started, setting, value, reason))


class HillClimb:
    """Chooses one of `values` (increasing) from the consumer's measured rate.

    Call `observe(elements)` each time the consumer has taken `elements` more; it returns
    the value to use from now on (the same one while measuring). The climb: measure the
    starting value, try the next larger one while each raises the rate by more than
    `GAIN` (a step that does not is measured once more before the climb gives up); if the
    first step up did not, try smaller ones while each loses at most
    `KEEP_FEWER` (fewer threads or workers for the same rate); then settle on the best.
    A settled rate that falls by `RETUNE_DROP`, or `RECLIMB_S` seconds settled, starts a
    new climb from where it is.
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
    ) -> None:
        if not values or list(values) != sorted(set(values)):
            raise ValueError(f"HillClimb values={values!r} must be increasing and non-empty.")
        self.setting = setting
        self.values = list(values)
        self._unit = unit
        self._up_only, self._down_only = up_only, down_only
        self._i = min(range(len(self.values)), key=lambda k: abs(self.values[k] - start))
        self._tuning = tuning
        self._rates: dict[int, float] = {}  # index -> measured rate in this climb
        self._retried: set[int] = set()  # values measured twice in this climb
        self._first_try: dict[int, float] = {}
        self._phase = "up"
        self._best = self._i
        self._settled_rate: float | None = None
        self._settled_at = 0.0
        self._reset_window()
        tuning.note(setting, self.value, f"start ({self._start_reason()})")

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

    def _reset_window(self) -> None:
        self._t0 = time.monotonic()
        self._count = 0
        self._measuring_since: float | None = None

    def observe(self, elements: int) -> int:
        now = time.monotonic()
        if self._measuring_since is None:
            if now - self._t0 < SETTLE_S:
                return self.value
            self._measuring_since, self._count = now, 0
            return self.value
        self._count += elements
        elapsed = now - self._measuring_since
        if elapsed < WINDOW_S or self._count < 4:
            return self.value
        rate = self._count / elapsed
        if self._settled_rate is not None:
            self._watch(rate)
        else:
            self._step(rate)
        self._reset_window()
        return self.value

    def _fmt(self, rate: float) -> str:
        return f"{rate:,.0f} {self._unit}/s"

    def _step(self, rate: float) -> None:
        i = self._i
        fastest = max(self._rates.values(), default=rate)  # before this measurement
        self._rates[i] = rate
        if i == self._best:  # the first measurement of a climb
            if not self._down_only and i + 1 < len(self.values):
                self._move(i + 1, "up", f"{self.values[i]} gave {self._fmt(rate)}: trying more")
            elif not self._up_only and i > 0:
                self._move(i - 1, "down", f"{self.values[i]} gave {self._fmt(rate)}: trying fewer")
            else:
                self._settle()
            return
        best_rate = self._rates[self._best]
        if self._phase == "up":
            if rate <= best_rate * (1 + GAIN) and i not in self._retried:
                # One more window before giving up: on a shared machine one window can
                # lose its CPU to another process.
                self._retried.add(i)
                self._first_try[i] = rate
                return
            if i in self._first_try:  # the mean of both windows: the max would favour steps
                rate = (rate + self._first_try[i]) / 2
            self._rates[i] = rate
            if rate > best_rate * (1 + GAIN):
                self._best = i
                if i + 1 < len(self.values):
                    self._move(i + 1, "up", f"{self.values[i]} gave {self._fmt(rate)}: trying more")
                    return
            elif not self._up_only and len(self._rates) == 2 and self._best > 0:
                # the first step up did not pay: maybe fewer do as well
                self._move(
                    self._best - 1,
                    "down",
                    f"{self.values[i]} gave {self._fmt(rate)}, not > {GAIN:.0%} more than "
                    f"{self.values[self._best]}: trying fewer",
                )
                return
        elif rate >= fastest * (1 - KEEP_FEWER):  # not compounded step after step
            self._best = i
            if i > 0:
                self._move(i - 1, "down", f"{self.values[i]} gave {self._fmt(rate)}: trying fewer")
                return
        self._settle()

    def _move(self, i: int, phase: str, reason: str) -> None:
        self._i, self._phase = i, phase
        self._tuning.note(self.setting, self.value, reason)

    def _settle(self) -> None:
        self._i = self._best
        best_rate = self._rates[self._best]
        self._settled_rate = best_rate
        self._settled_at = time.monotonic()
        tried = ", ".join(
            f"{self.values[k]}: {self._fmt(r)}" for k, r in sorted(self._rates.items())
        )
        self._tuning.note(
            self.setting,
            self.value,
            f"settled; measured {tried} (a step is kept for > {GAIN:.0%} more, or fewer "
            f"for < {KEEP_FEWER:.0%} less)",
        )

    def _watch(self, rate: float) -> None:
        settled = self._settled_rate or 0.0
        dropped = rate < settled * (1 - RETUNE_DROP)
        if dropped or time.monotonic() - self._settled_at > RECLIMB_S:
            why = (
                f"rate fell to {self._fmt(rate)} from {self._fmt(settled)}"
                if dropped
                else f"settled for {RECLIMB_S:.0f} s"
            )
            self._tuning.note(self.setting, self.value, f"{why}: tuning again")
            self._settled_rate = None
            self._rates, self._retried, self._first_try = {}, set(), {}
            self._best = self._i
            self._step(rate)
        else:
            # follow slow drifts so that a later drop is measured against the present
            self._settled_rate = 0.8 * settled + 0.2 * rate


__all__ = [
    "AUTOTUNE",
    "Autotune",
    "Decision",
    "HillClimb",
    "Tuning",
    "available_memory",
    "is_autotune",
    "memory_budget",
    "usable_cores",
]
