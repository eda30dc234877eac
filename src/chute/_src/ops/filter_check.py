"""The warning (and error) Grain gives when a filter drops nearly everything, and
`WithOptionsIterDataset`, the stage that attaches the `DatasetOptions` setting it.

Every 1000 elements a filter has tested (or `to_iter_dataset` has read past a MapDataset
`filter`), the share it dropped is checked; at 90 % or more it logs a warning (the
"chute" logger, as Grain logs one), at most once a minute per iterator, in Grain's words. `DatasetOptions(filter_warn_threshold_ratio=...,
filter_raise_threshold_ratio=...)` attached with `WithOptionsIterDataset` above the filter
change the share that warns, and make a share above the raise threshold a ValueError, as
in Grain; the options are those in force where the filter's iterator is made
(`OPTIONS`, set by `WithOptionsIterDataset` while it makes its parents' iterators).
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any, TypeVar

from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.core.options import DatasetOptions

T = TypeVar("T")

CHECK_INTERVAL = 1000
WARN_RATIO = 0.9
WARN_INTERVAL_S = 60.0


# The `DatasetOptions` of the `WithOptionsIterDataset` whose parents' iterators are being
# made (None: Grain's defaults); filters read it as their iterators are made.
OPTIONS: contextvars.ContextVar[Any] = contextvars.ContextVar("chute_dataset_options", default=None)


class WithOptionsIterDataset(IterDataset[T]):
    """`parent` with `options` attached (merged with options set further down).

    >>> import chute
    >>> ds = chute.MapDataset.range(3).to_iter_dataset()
    >>> list(WithOptionsIterDataset(ds, DatasetOptions(filter_raise_threshold_ratio=0.5)))
    [0, 1, 2]
    """

    _role = StageRole.PASS_THROUGH

    def __init__(self, parent: IterDataset[T], options: DatasetOptions) -> None:
        super().__init__([parent])
        if not isinstance(options, DatasetOptions):
            raise TypeError(
                f"WithOptionsIterDataset: options={options!r} is not a DatasetOptions: pass "
                "chute.experimental.DatasetOptions(...)."
            )
        self._options = options

    @property
    def options(self) -> DatasetOptions:
        """The options of the pipeline up to this stage, later settings first."""
        below = [p.options for p in self.parents if isinstance(p, WithOptionsIterDataset)]
        return self._options.merge(below[0] if below else None)

    def _make_iterator(self) -> DatasetIterator[T]:
        # Options set further up the pipeline (nearer the consumer) win over these.
        above = OPTIONS.get()
        token = OPTIONS.set(self.options if above is None else above.merge(self.options))
        try:
            return self._parent_iter()
        finally:
            OPTIONS.reset(token)

    def __repr__(self) -> str:
        return f"WithOptionsIterDataset(options={self._options!r})"


def _options_of(stage: object) -> Any:
    """The `DatasetOptions` in force for `stage`: those of the `WithOptionsIterDataset`s
    above it (`OPTIONS`, set while they make their parents' iterators) first, then those
    below it, as in Grain, where options anywhere in the pipeline apply to all of it."""
    found = OPTIONS.get()
    stack, seen = [stage], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, WithOptionsIterDataset):
            found = node.options if found is None else found.merge(node.options)
            continue  # its options already hold those below it
        stack.extend(reversed(getattr(node, "parents", ())))
    return found


class SkipCounter:
    """Watches a filter's running totals; logs a warning when it drops `WARN_RATIO` or more of the
    `CHECK_INTERVAL` (or more) elements seen since the last look."""

    __slots__ = (
        "_dropped_at",
        "_label",
        "_last_warning",
        "_raise_ratio",
        "_seen_at",
        "_shown",
        "_stage",
        "_warn_ratio",
    )

    def __init__(self, stage: object, label: str = "", shown: str | None = None) -> None:
        # What the message names: `label` and the stage's repr (made only when warning),
        # or `shown`.
        self._stage, self._label, self._shown = stage, label, shown
        self._seen_at = self._dropped_at = 0  # the totals at the last look
        self._last_warning: float | None = None
        options = _options_of(stage)
        self._warn_ratio: float | None = WARN_RATIO
        self._raise_ratio: float | None = None
        if options is not None:
            self._warn_ratio = options.filter_warn_threshold_ratio
            self._raise_ratio = options.filter_raise_threshold_ratio

    def update(self, seen: int, dropped: int) -> None:
        """`seen`: elements tested so far, `dropped`: how many of them were dropped."""
        window = seen - self._seen_at
        if window < CHECK_INTERVAL:
            return
        ratio = (dropped - self._dropped_at) / window
        self._seen_at, self._dropped_at = seen, dropped
        message = (
            f"Transformation {self._shown or f'{self._label}{self._stage!r}'} skipped "
            f"{ratio * 100:.2f} % of the "
            f"last seen {window} elements. Please check the filtering logic."
        )
        if self._raise_ratio is not None and ratio > self._raise_ratio:
            raise ValueError(
                f"{message} It is over filter_raise_threshold_ratio={self._raise_ratio} of "
                "the pipeline's DatasetOptions: pre-filter the input dataset, or raise the "
                "threshold (None: never raise)."
            )
        now = time.monotonic()
        if (
            self._warn_ratio is None
            or ratio < self._warn_ratio
            or (self._last_warning is not None and now - self._last_warning < WARN_INTERVAL_S)
        ):
            return
        self._last_warning = now
        logging.getLogger("chute").warning(
            "%s If this is intended, consider pre-filtering the input dataset before "
            "training, or set DatasetOptions(filter_warn_threshold_ratio=None) with "
            "WithOptionsIterDataset to turn this off.",
            message,
        )
