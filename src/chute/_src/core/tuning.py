"""The `AUTOTUNE` sentinel, and what an iterator reports of how its elements are scheduled.

`AUTOTUNE` (of type `Autotune`) is what an option, or a source, says to leave a setting to
the engine (`_src/exec/autotune.py` chooses it at run time). An iterator that computes
elsewhere than the consumer's thread reports it with `parallelism()` (a `Parallelism`),
and one whose settings are tuned with `tuning()` (a `Tuning`, its `Decision`s): the
engine makes them, the debug summary reads them.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import Final, Literal, TypeAlias

__all__ = ["AUTOTUNE", "Autotune", "Decision", "Parallelism", "Tuning", "is_autotune"]


class _Autotune(enum.Enum):
    AUTOTUNE = "AUTOTUNE"

    def __repr__(self) -> str:
        return "AUTOTUNE"


AUTOTUNE: Final = _Autotune.AUTOTUNE
"""Leave a setting to chute, tuned at run time (tf.data's `tf.data.AUTOTUNE`)."""

Autotune: TypeAlias = Literal[_Autotune.AUTOTUNE]
"""The type of `AUTOTUNE`, for annotations: `int | Autotune`."""


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


@dataclasses.dataclass(frozen=True)
class Parallelism:
    """What computes a stage's elements besides the consumer's thread, as configured (or
    chosen by AUTOTUNE) now: `threads` of this process, or worker `processes`; both 0 on
    the consumer's thread. Iterators that compute elsewhere say so with a `parallelism()`
    method: the debug summary compares it with the usable cores."""

    threads: int = 0
    processes: int = 0
