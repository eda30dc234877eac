"""The warning Grain gives when a filter drops nearly everything.

Every 1000 elements a filter has tested (or `to_iter_dataset` has read past a MapDataset
`filter`), the share it dropped is checked; at 90 % or more it warns, at most once a
minute per iterator, in Grain's words. Grain's defaults; chute's `DatasetOptions` do not
change them (`docs/grain_differences.md`).
"""

from __future__ import annotations

import time
import warnings

CHECK_INTERVAL = 1000
WARN_RATIO = 0.9
WARN_INTERVAL_S = 60.0


class SkipCounter:
    """Watches a filter's running totals; warns when it drops `WARN_RATIO` or more of the
    `CHECK_INTERVAL` (or more) elements seen since the last look."""

    __slots__ = ("_dropped_at", "_label", "_last_warning", "_seen_at", "_stage")

    def __init__(self, stage: object, label: str = "") -> None:
        self._stage, self._label = stage, label  # named (repr) only when warning
        self._seen_at = self._dropped_at = 0  # the totals at the last look
        self._last_warning: float | None = None

    def update(self, seen: int, dropped: int) -> None:
        """`seen`: elements tested so far, `dropped`: how many of them were dropped."""
        window = seen - self._seen_at
        if window < CHECK_INTERVAL:
            return
        ratio = (dropped - self._dropped_at) / window
        self._seen_at, self._dropped_at = seen, dropped
        now = time.monotonic()
        if ratio < WARN_RATIO or (
            self._last_warning is not None and now - self._last_warning < WARN_INTERVAL_S
        ):
            return
        self._last_warning = now
        warnings.warn(
            f"Transformation {self._label}{self._stage!r} skipped {ratio * 100:.2f} % of the last seen "
            f"{window} elements. Please check the filtering logic. If this is intended, "
            "consider pre-filtering the input dataset before training.",
            stacklevel=4,
        )
