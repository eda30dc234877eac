"""The options a pipeline is given.

- `ReadOptions`: how `to_iter_dataset` computes elements in one process (threads, buffer).
- `DatasetOptions`, attached by `WithOptionsIterDataset` (`ops/filter_check.py`, where
  the filters read them): the filter thresholds and stage timing of the pipeline below.
  Stage timing is debug mode (`chute.stats`), and chute chooses by itself which arrays go
  through shared memory (`docs/grain_differences.md`).
- `MultiprocessingOptions`: how `mp_prefetch` uses worker processes.

Process-wide switches (debug mode) are not here: they are `chute.config` (`config.py`).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from chute._src.core.tuning import AUTOTUNE, Autotune

if TYPE_CHECKING:
    from chute._src.core.dataset import IterDataset, MapDataset


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How `to_iter_dataset` computes elements in one process.

    num_threads: threads computing elements in parallel, in index order; 0 computes them in
      the consuming thread. Threads help when the work releases the GIL (I/O, numpy,
      tokenizers, decoding); work that holds the GIL wants worker processes instead.
      `chute.AUTOTUNE` (the default): chosen while the pipeline runs, from 0 (the
      consuming thread) up to 64 threads, by the rate at which the consumer takes
      elements (`docs/performance.md`).
    prefetch_buffer_size: how many elements may be computed ahead of the consumer. 0 (with
      any `num_threads`) computes on demand in the consuming thread, as Grain does: no
      element is computed before it is asked for, beyond the block being computed.
      `chute.AUTOTUNE` (the default): grown while the consumer finds nothing computed,
      within a quarter of the available memory.
    """

    num_threads: int | Autotune = AUTOTUNE
    prefetch_buffer_size: int | Autotune = AUTOTUNE

    def __post_init__(self) -> None:
        for name in ("num_threads", "prefetch_buffer_size"):
            value = getattr(self, name)
            if value is AUTOTUNE:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"ReadOptions: {name}={value!r} is invalid: {name} must be non-negative, "
                    f"an int >= 0 or chute.AUTOTUNE; e.g. ReadOptions({name}=4)."
                )
        threads, buffer = self.num_threads, self.prefetch_buffer_size
        if threads is not AUTOTUNE and buffer is not AUTOTUNE and 0 < buffer < threads:
            # Grain's warning, logged (not `warnings`) as Grain logs it.
            logging.getLogger("chute").warning(
                "prefetch_buffer_size=%s is smaller than num_threads=%s. This will limit the "
                "number of threads that can actually be used in parallel to %s, potentially "
                "hurting performance. Please set prefetch_buffer_size >= num_threads.",
                buffer,
                threads,
                buffer,
            )


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


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
    """How `IterDataset.mp_prefetch` uses worker processes.

    num_workers: worker processes computing elements; 0 computes in this process. The
      output is the same for every value. `chute.AUTOTUNE` (what `mp_prefetch()` without
      options uses): as many workers as this process may use cores
      (`os.sched_getaffinity`), fewer if the memory available would not hold them, and
      while the pipeline runs, fewer of them are given work when that costs no rate (and
      more again when a later climb finds that pays).
    per_worker_buffer_size: chunks of elements each worker may compute ahead.
    enable_profiling: as in Grain, log profiling information: the pipeline up to this
      stage records per-stage statistics and prints the execution summary to stderr when
      the iterator ends or is closed (what `chute.config.update("py_debug_mode", True)`
      does for every pipeline). Works with any number of workers, 0 included.
    stall_warning_s: when the consumer has waited this many seconds for a worker that
      produces nothing, a `chute.multiprocessing.WorkerStallWarning` shows the worker's
      Python stack (every thread) and the element indices it is computing; again after
      each further `stall_warning_s`. None: never warn.
    timeout_s: the longest the consumer waits for a worker that produces nothing; then
      `chute.multiprocessing.WorkerTimeoutError` names the worker, the element indices
      and its stack, and the workers are stopped. None (the default): wait as long as it
      takes.
    """

    num_workers: int | Autotune = 0
    per_worker_buffer_size: int = 2
    enable_profiling: bool = False
    stall_warning_s: float | None = 300.0
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enable_profiling, bool):
            raise TypeError(
                f"MultiprocessingOptions: enable_profiling={self.enable_profiling!r} is "
                "invalid: pass True or False."
            )
        for name, low in (("num_workers", 0), ("per_worker_buffer_size", 1)):
            value = getattr(self, name)
            if name == "num_workers" and value is AUTOTUNE:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                also = " or chute.AUTOTUNE" if name == "num_workers" else ""
                raise ValueError(
                    f"MultiprocessingOptions: {name}={value!r} is invalid: it must be an int "
                    f">= {low}{also}; e.g. MultiprocessingOptions(num_workers=2)."
                )
        for name in ("stall_warning_s", "timeout_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"MultiprocessingOptions: {name}={value!r} is invalid: it must be a "
                    f"number of seconds > 0, or None to turn it off; e.g. "
                    f"MultiprocessingOptions({name}=600)."
                )

    def start_service(
        self,
        leaves: list[MapDataset[Any]],
        streams: list[Any],
        worker_init_fn: Callable[[int, int], None] | None,
        pipeline: IterDataset[Any],
    ) -> Any:
        """Starts the workers that compute `leaves` and `streams` (what `mp_prefetch` moves
        out of `pipeline`) and returns the service that feeds them tasks (a
        `ChunkBackend`, `_src/exec/workers/backend.py`): here, worker processes on this
        machine. Each kind of workers is a subclass that overrides this
        (`chute.ray.RayWorkers`: Ray actors)."""
        from chute._src.core.chain import operation

        return operation("start_processes")(self, leaves, streams, worker_init_fn, pipeline)
