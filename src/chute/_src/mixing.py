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
from collections.abc import Sequence
from typing import Any

import numpy as np

_MAX_PERIOD = 1 << 22


def int_proportions(weights: Sequence[Any] | None, n: int, where: str) -> list[int]:
    """The weights as integers, as Grain makes them: each scaled so that the smallest is
    100, truncated, then divided by their gcd."""
    if weights is None:
        return [1] * n
    ws = list(weights)
    if len(ws) != n:
        raise ValueError(
            f"{where}: {len(ws)} weights for {n} datasets: give one weight per dataset."
        )
    for w in ws:
        if isinstance(w, bool) or not isinstance(w, int | float | np.number) or not w > 0:
            raise ValueError(
                f"{where}: weight {w!r} is invalid: weights must be positive numbers; drop "
                "a dataset rather than giving it weight 0."
            )
    # Grain's scaling, float arithmetic and truncation included: the smallest weight becomes
    # 100. Weights 0.7 and 0.3 are thus 233 and 100 (not 7 and 3), which decides the
    # mixture's length and order; dividing by the gcd changes neither, only the period.
    scale = 100 / min(ws)
    ints = [int(w * scale) for w in ws]
    divisor = math.gcd(*ints)
    return [i // divisor for i in ints]


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
