"""`DatasetOptions` and `WithOptionsIterDataset`: options attached to a pipeline.

The filter thresholds act on the filters below (`filter_check.py`): the options are in
force while the stage makes its parents' iterators. Stage timing is debug mode
(`chute.stats`), and chute chooses by itself which arrays go through shared memory
(`docs/grain_differences.md`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import enum
from typing import Any, TypeVar

from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import DatasetIterator

T = TypeVar("T")

# The `DatasetOptions` of the `WithOptionsIterDataset` whose parents' iterators are being
# made (None: Grain's defaults); filters read it as their iterators are made
# (`ops/filter_check.py`).
OPTIONS: contextvars.ContextVar[Any] = contextvars.ContextVar("chute_dataset_options", default=None)


class ExecutionTrackingMode(enum.Enum):
    """Whether per-stage timings are collected: chute's debug mode (`chute.stats`)."""

    DISABLED = enum.auto()
    STAGE_TIMING = enum.auto()


_DEFAULTS: dict[str, Any] = {
    "filter_warn_threshold_ratio": 0.9,
    "filter_raise_threshold_ratio": None,
    "execution_tracking_mode": ExecutionTrackingMode.DISABLED,
    "min_shm_size": 0,
}


class _Unset:
    def __repr__(self) -> str:
        return "<default>"


_UNSET: Any = _Unset()


@dataclasses.dataclass(frozen=True, init=False)
class DatasetOptions:
    """Options of a pipeline; `merge` keeps the options given explicitly, the other's first.

    >>> a = DatasetOptions(filter_warn_threshold_ratio=0.7)
    >>> b = DatasetOptions(filter_raise_threshold_ratio=0.8, filter_warn_threshold_ratio=0.5)
    >>> m = a.merge(b)
    >>> m.filter_warn_threshold_ratio, m.filter_raise_threshold_ratio
    (0.7, 0.8)
    """

    filter_warn_threshold_ratio: float | None
    filter_raise_threshold_ratio: float | None
    execution_tracking_mode: ExecutionTrackingMode
    min_shm_size: int
    _given: frozenset[str] = dataclasses.field(repr=False, compare=False)

    def __init__(
        self,
        *,
        filter_warn_threshold_ratio: float | None = _UNSET,
        filter_raise_threshold_ratio: float | None = _UNSET,
        execution_tracking_mode: ExecutionTrackingMode = _UNSET,
        min_shm_size: int = _UNSET,
    ) -> None:
        given = {
            "filter_warn_threshold_ratio": filter_warn_threshold_ratio,
            "filter_raise_threshold_ratio": filter_raise_threshold_ratio,
            "execution_tracking_mode": execution_tracking_mode,
            "min_shm_size": min_shm_size,
        }
        for name, value in given.items():
            object.__setattr__(self, name, _DEFAULTS[name] if value is _UNSET else value)
        explicit = frozenset(n for n, v in given.items() if v is not _UNSET)
        object.__setattr__(self, "_given", explicit)

    def merge(self, other: DatasetOptions | None) -> DatasetOptions:
        """These options, with `other`'s filling in those not given explicitly here."""
        if other is None:
            return self
        values = {n: getattr(other, n) for n in other._given}
        values.update({n: getattr(self, n) for n in self._given})
        return DatasetOptions(**values)


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
