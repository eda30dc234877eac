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
    """Counts what a filter keeps and drops; warns when it drops `WARN_RATIO` or more."""

    __slots__ = ("_kept", "_label", "_last_warning", "_skipped", "_stage")

    def __init__(self, stage: object, label: str = "") -> None:
        self._stage, self._label = stage, label  # named (repr) only when warning
        self._kept = 0
        self._skipped = 0
        self._last_warning: float | None = None

    def add(self, kept: int, skipped: int) -> None:
        self._kept += kept
        self._skipped += skipped
        seen = self._kept + self._skipped
        if seen < CHECK_INTERVAL:
            return
        ratio = self._skipped / seen
        self._kept = self._skipped = 0
        now = time.monotonic()
        if ratio < WARN_RATIO or (
            self._last_warning is not None and now - self._last_warning < WARN_INTERVAL_S
        ):
            return
        self._last_warning = now
        warnings.warn(
            f"Transformation {self._label}{self._stage!r} skipped {ratio * 100:.2f} % of the last seen "
            f"{seen} elements. Please check the filtering logic. If this is intended, "
            "consider pre-filtering the input dataset before training.",
            stacklevel=4,
        )
