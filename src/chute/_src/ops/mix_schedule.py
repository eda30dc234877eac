"""The schedule of a mixture (`MapDataset.mix`, `IterDataset.mix`): which input each
position draws from, and the weights changed between steps.

**Which input.** Grain's rule: the weights become integer proportions `p` (scaled so that
the smallest is 100, then truncated, as Grain does: 0.7 and 0.3 are 233 and 100), and
position `k` of the mixture is drawn from the dataset whose running count
`floor`-increases at `k`. The pattern repeats every `sum(p)` positions and, within each
period, dataset `i` appears exactly `p[i]` times, so the realised proportions match `p` at
every multiple of the period and within one element of them in between (`Schedule`,
`Weights`).

**Changes.** Weights given between steps of an `IterDataset.mix` iterator (`set_weights`,
`chute.experimental.set_mix_weights`, and weights given after a restore) hold from the
mixture's next draw position. Each change is
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
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import MAX_POSITION
from chute._src.core.state_checks import quote

MAX_CHANGES = 1024
"""The most weight changes a mixture's schedule keeps (and its state holds)."""

NEVER = MAX_POSITION + 1
"""The position of no change."""

_MAX_PERIOD = 1 << 22


def int_proportions(
    weights: Sequence[Any] | None, n: int, where: str, *, allow_zero: bool = False
) -> list[int]:
    """The weights as integers, as Grain makes them: each scaled so that the smallest
    positive one is 100, truncated, then divided by their gcd.

    A weight of 0 (allowed with `allow_zero`: weights given at run time) stays 0: its
    dataset is never drawn while the weights hold. At least one weight must be positive."""
    if weights is None:
        return [1] * n
    ws = list(weights)
    if len(ws) != n:
        raise ValueError(
            f"{where}: {len(ws)} weights for {n} datasets: give one weight per dataset."
        )
    for w in ws:
        if isinstance(w, bool) or not isinstance(w, int | float | np.number) or not w >= 0:
            raise ValueError(
                f"{where}: weight {w!r} is invalid: weights must be numbers >= 0; give "
                "each dataset a positive weight (or 0 to draw nothing from it)."
            )
        if not allow_zero and not w > 0:
            raise ValueError(
                f"{where}: weight {w!r} is invalid: these weights must be positive (as in "
                "Grain's mixtures); drop a dataset rather than giving it weight 0, or, for an "
                "IterDataset.mix, switch it off at run time with set_weights or a function of "
                "the step, which take 0."
            )
    if not any(w > 0 for w in ws):
        raise ValueError(
            f"{where}: weights {ws!r} are invalid: at least one weight must be positive (a "
            "weight of 0 draws nothing from its dataset, and a mixture must draw from "
            "one); give at least one dataset a positive weight."
        )
    ints = grain_proportions(ws)
    divisor = math.gcd(*ints)
    return [i // divisor for i in ints]


def grain_proportions(weights: Sequence[Any]) -> list[int]:
    """Grain's integer proportions of valid `weights`, before the gcd: scaled so that the
    smallest (positive) is 100, float arithmetic and truncation included. Weights 0.7 and
    0.3 are thus 233 and 100 (not 7 and 3), which decides the mixture's length and order;
    dividing by the gcd changes neither, only the period. A weight of 0 stays 0."""
    scale = 100 / min(w for w in weights if w > 0)
    return [int(w * scale) for w in weights]


class Schedule:
    """Which dataset serves position `k`, and which of its elements, for blocks of `k`."""

    def __init__(self, proportions: Sequence[int], where: str) -> None:
        self.proportions = tuple(proportions)
        period = sum(self.proportions)
        if period > _MAX_PERIOD:
            raise ValueError(
                f"{where}: the weights {list(self.proportions)} are too uneven (their ratio "
                f"makes a schedule of {period} positions, over {_MAX_PERIOD}): keep the ratio "
                "of the largest to the smallest weight under ~10,000."
            )
        self.period = period
        k = np.arange(period, dtype=np.int64)
        which = np.full(period, -1, dtype=np.int64)
        rank = np.zeros(period, dtype=np.int64)
        remaining = period
        cur, cur1 = k.copy(), k + 1
        for i, p in enumerate(self.proportions):
            if p == 0:  # never drawn (a runtime weight of 0)
                continue
            nxt = (cur * (remaining - p)) // remaining
            nxt1 = (cur1 * (remaining - p)) // remaining
            count1 = cur1 - nxt1
            hit = (which < 0) & ((cur - nxt) != count1)
            which[hit] = i
            rank[hit] = count1[hit] - 1
            remaining -= p
            cur, cur1 = nxt, nxt1
        self.which = which
        self.rank = rank  # rank of position k among dataset which[k]'s positions in a period

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset, index in that dataset) for every position in `indices`."""
        cycles, pos = np.divmod(indices, self.period)
        which = self.which[pos]
        props = np.asarray(self.proportions, dtype=np.int64)
        return which, cycles * props[which] + self.rank[pos]


class Weights:
    """The weights of a mixture at every step: fixed, or a function of the step.

    A function `weights(step)` (a sequence, or a mapping by name for a mixture given as a
    dict) is asked once per step, with `step = position // step_size`. Whatever the
    weights, position `k` is drawn from the schedule of the weights in force at `k`, at
    `k % period`: Grain's pattern spreads every input evenly over its period, so any
    stretch of it (a step, however short) gives each input its share within one element,
    and the fixed-weight mixture is Grain's exactly.

    With `runtime_zero`, the weights a function returns may include 0 (that input is not
    drawn during the step; `IterDataset.mix`). Fixed weights are always positive, as in
    Grain; weights set at run time (`schedule_of(..., allow_zero=True)`) may be 0.
    """

    def __init__(
        self,
        weights: Any,
        n: int,
        where: str,
        *,
        names: Sequence[str] | None = None,
        step_size: int = 1,
        runtime_zero: bool = False,
    ) -> None:
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size < 1:
            raise ValueError(
                f"{where}: step_size={step_size!r} is invalid: it must be a positive int, the "
                "number of positions per step of weights(step) (e.g. the batch size)."
            )
        self.n, self.where, self.names, self.step_size = n, where, names, step_size
        self.runtime_zero = runtime_zero
        self.fn: Callable[[int], Any] | None = weights if callable(weights) else None
        self._schedules: dict[tuple[int, ...], Schedule] = {}
        self._step = -1
        self._current: Schedule | None = None
        if self.fn is None:
            self._current = self.schedule_of(weights)

    @property
    def dynamic(self) -> bool:
        return self.fn is not None

    def as_list(self, weights: Any, context: str = "") -> list[Any] | None:
        """`weights` (a sequence, a mapping by name, or None) as a list in input order."""
        if weights is None or self.names is None:
            if isinstance(weights, Mapping):
                raise TypeError(
                    f"{self.where}{context}: weights is a dict but the datasets are a list: "
                    "give weights as a list, one per dataset."
                )
            return None if weights is None else list(weights)
        if not isinstance(weights, Mapping) or set(weights) != set(self.names):
            raise ValueError(
                f"{self.where}{context}: weights={weights!r} do not match the datasets' names "
                f"{list(self.names)}: for datasets given as a dict, give weights as a dict "
                "with the same keys."
            )
        return [weights[k] for k in self.names]

    def schedule_of(self, weights: Any, context: str = "", *, allow_zero: bool = False) -> Schedule:
        """The schedule of `weights`; a weight of 0 only with `allow_zero` (run time)."""
        values = self.as_list(weights, context)
        props = tuple(int_proportions(values, self.n, self.where + context, allow_zero=allow_zero))
        schedule = self._schedules.get(props)
        if schedule is None:
            if len(self._schedules) > 1024:
                self._schedules.clear()
            schedule = self._schedules[props] = Schedule(props, self.where)
        return schedule

    def compute(self, step: int) -> Schedule:
        """The schedule in force during `step`, asked of the function anew (no memo of the
        current step: safe from several threads)."""
        if self.fn is None:
            assert self._current is not None
            return self._current
        value = self.fn(step)
        context = f", weights({step}) returned {value!r}"
        return self.schedule_of(value, context, allow_zero=self.runtime_zero)

    def at_step(self, step: int) -> Schedule:
        """The schedule in force during `step` (for one thread: it keeps the last step's)."""
        if self.fn is None or step == self._step:
            assert self._current is not None
            return self._current
        value = self.fn(step)
        context = f", weights({step}) returned {value!r}"
        self._current = self.schedule_of(value, context, allow_zero=self.runtime_zero)
        self._step = step
        return self._current

    def which(self, indices: np.ndarray) -> np.ndarray:
        """The input of every position in `indices` (consecutive, ascending)."""
        if self.fn is None:
            assert self._current is not None
            return self._current.locate(indices)[0]
        out = np.empty(len(indices), dtype=np.int64)
        steps = indices // self.step_size
        for step in np.unique(steps).tolist():
            sel = steps == step
            schedule = self.at_step(step)
            out[sel] = schedule.which[indices[sel] % schedule.period]
        return out


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
