"""The deterministic mixing schedule shared by `MapDataset.mix` and `IterDataset.mix`.

Grain's rule: the weights become integer proportions `p` (scaled so that the smallest is
100, then truncated, as Grain does: 0.7 and 0.3 are 233 and 100), and position `k` of the
mixture is drawn from the dataset whose running count `floor`-increases at `k`. The pattern
repeats every `sum(p)` positions and, within each period, dataset `i` appears exactly `p[i]`
times, so the realised proportions match `p` at every multiple of the period and within
one element of them in between.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

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
