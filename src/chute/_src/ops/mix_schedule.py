"""The schedule of weight changes of an `IterDataset.mix` iterator: part of its state.

Weights given between steps (`set_weights`, `chute.experimental.set_mix_weights`, and
weights given after a restore) hold from the mixture's next draw position. Each change is
recorded with that position, in the iterator and in its state (`"changes"`: a list of
`[position, weights]`, positions ascending), so that whatever replays the mixture from an
earlier position makes every change again where it was made:

- a windowed stage above the mixture (`batch_by_tokens`, `bucket_by_sequence_length`,
  `WindowShuffleIterDataset`, the packers) or a prefetching one (`prefetch`) hands out a
  state that starts before its window or buffer: the pipeline's top brings the mixture's
  state in it up to date (`DatasetIterator._catch_up`) before handing it out;
- a stage that rewinds the mixture to its start (`repeat`, `cache` reading again) does
  the same with the state it rewinds to.

The bound: the schedule keeps the last `MAX_CHANGES` changes (several calls at one position
are one change: the last one holds). A replay from a position before the oldest change
kept, which would need a change no longer known, raises `ValueError` rather than draw
with other weights. The schedule's entries are keyed by the mixture's own position, so
the state grows by one short entry per change, never per element.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable
from typing import Any

from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import MAX_POSITION
from chute._src.core.state_checks import quote

MAX_CHANGES = 1024
"""The most weight changes a mixture's schedule keeps (and its state holds)."""

NEVER = MAX_POSITION + 1
"""The position of no change."""


class ChangeLog:
    """Weights given at run time, each with the position from which it holds."""

    __slots__ = ("forgotten", "positions", "weights")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.weights: list[Any] = []  # as the state records them (a list, or a dict by name)
        self.forgotten = -1  # the position of the latest change dropped by the bound

    def __bool__(self) -> bool:
        return bool(self.positions)

    def record(self, position: int, weights: Any) -> None:
        """Weights from `position` on. Changes recorded for later positions (a restored
        schedule the mixture had not reached yet) are replaced: the latest call holds."""
        cut = bisect.bisect_left(self.positions, position)
        del self.positions[cut:], self.weights[cut:]
        self.positions.append(position)
        self.weights.append(weights)
        if len(self.positions) > MAX_CHANGES:
            self.forgotten = self.positions.pop(0)
            self.weights.pop(0)

    def due_after(self, index: int) -> int:
        """The position of the first change after `index` (`NEVER` if none)."""
        i = bisect.bisect_right(self.positions, index)
        return self.positions[i] if i < len(self.positions) else NEVER

    def at(self, position: int) -> Any:
        """The weights of the change at `position` (there must be one)."""
        i = bisect.bisect_left(self.positions, position)
        assert self.positions[i] == position
        return self.weights[i]

    def in_force(self, index: int) -> Any:
        """The weights of the latest change at or before `index`, or None."""
        i = bisect.bisect_right(self.positions, index)
        return self.weights[i - 1] if i else None

    def as_state(self) -> list[list[Any]]:
        return [[p, copy.copy(w)] for p, w in zip(self.positions, self.weights)]

    @classmethod
    def from_state(cls, value: Any, path: str, check: Callable[[Any, str], None]) -> ChangeLog:
        """The schedule a state records at `path` (`state["changes"]`); `check(weights,
        where)` raises `CheckpointError` for weights it cannot take."""
        log = cls()
        fix = "restore a state taken by get_state() of this mixture"
        if not isinstance(value, list) or not 0 < len(value) <= MAX_CHANGES:
            raise CheckpointError(
                f"{path} is invalid: it must be a list of 1 to {MAX_CHANGES} changes "
                f"[position, weights], the schedule of the mixture's weights; {fix}."
            )
        for i, entry in enumerate(value):
            where = f"{path}[{i}]"
            if not isinstance(entry, list) or len(entry) != 2:
                raise CheckpointError(
                    f"{where} is invalid: a change is a list [position, weights]; {fix}."
                )
            lo = log.positions[-1] + 1 if log.positions else 0
            position = entry[0]
            if (
                isinstance(position, bool)
                or not isinstance(position, int)
                or not (lo <= position <= MAX_POSITION)
            ):
                raise CheckpointError(
                    f"{where}[0] = {quote(position)} is invalid: a change's position must be an "
                    f"int in [{lo}, {MAX_POSITION}] (positions ascend); {fix}."
                )
            check(entry[1], f"{where}[1]")
            log.positions.append(position)
            log.weights.append(entry[1])
        if len(log.positions) == MAX_CHANGES:
            # A full schedule may have dropped older changes: none before its first is known.
            log.forgotten = log.positions[0] - 1
        return log

    def catch_up(self, state: dict[str, Any], index: int) -> dict[str, Any]:
        """`state`, a state of this mixture at position `index` taken earlier in this run,
        with this schedule (and so the weights in force at `index`, which a change at
        `index` made after `state` was taken has set)."""
        if self.forgotten >= index:
            raise ValueError(
                f"IterDataset.mix: a stage above the mixture replays it from position "
                f"{index} (a window's or an epoch's start), but the weights changed at more "
                f"than {MAX_CHANGES} positions since, and the mixture keeps the last "
                f"{MAX_CHANGES} changes (the latest dropped was at position {self.forgotten}): "
                "change the weights less often, give them as a function of the step "
                "(weights(step) keeps no schedule), or use smaller windows."
            )
        out = {k: v for k, v in state.items() if k not in ("weights", "changes")}
        weights = self.in_force(index)
        if weights is None:
            weights = state.get("weights")
        if weights is not None:
            out["weights"] = copy.copy(weights)
        if self:
            out["changes"] = self.as_state()
        return out
