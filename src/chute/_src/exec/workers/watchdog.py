"""Waiting for a worker's result within `MultiprocessingOptions.stall_warning_s` and
`timeout_s`: a `WorkerStallWarning` with the worker's Python stack while it produces
nothing, then a `WorkerTimeoutError`."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

from chute._src.exec.mp.errors import WorkerStallWarning, WorkerTimeoutError
from chute._src.exec.mp.pool import WorkerPool


class Watchdog:
    """Gets results from `pool`, bounding each wait as the options ask."""

    def __init__(
        self,
        pool: WorkerPool[Any, Any],
        stall_warning_s: float | None,
        timeout_s: float | None,
        on_timeout: Callable[[], None],
    ) -> None:
        self._pool = pool
        self._warn_every = stall_warning_s
        self._limit = timeout_s
        self._on_timeout = on_timeout  # stops the workers before the error is raised

    def get(self, worker: int, describe: Callable[[], str]) -> Any:
        """The pool's next result from `worker`, which computes what `describe()` names,
        warning while it stalls and giving up after the timeout."""
        warn_every, limit = self._warn_every, self._limit
        next_warning = warn_every
        t0 = time.monotonic()
        while True:
            marks = [m for m in (next_warning, limit) if m is not None]
            wait = max(0.0, min(marks) - (time.monotonic() - t0)) if marks else None
            try:
                return self._pool.get(worker, timeout=wait)
            except TimeoutError:
                if self._pool.closed:
                    raise  # the worker's own TimeoutError, not ours
            waited = time.monotonic() - t0
            if limit is not None and waited >= limit:
                who, stack = describe(), self.stack(worker)
                self._on_timeout()
                raise WorkerTimeoutError(
                    f"{who} produced nothing for {waited:.1f} s, the "
                    f"MultiprocessingOptions(timeout_s={limit}). Fix what its stack below "
                    "shows it waiting on (a lock, a network call, an endless loop), or give "
                    "a larger timeout_s (None waits as long as it takes). The workers are "
                    f"stopped. {stack}",
                    worker_index=worker,
                )
            if next_warning is not None and warn_every is not None and waited >= next_warning:
                next_warning += warn_every
                warnings.warn(
                    f"chute: {describe()} has produced nothing for {waited:.0f} s. "
                    "If it is stuck, its stack below shows where; if the work is just slow, "
                    "raise MultiprocessingOptions(stall_warning_s=...) above "
                    f"{warn_every} (None turns this warning off). {self.stack(worker)}",
                    WorkerStallWarning,
                    stacklevel=3,
                )

    def stack(self, worker: int) -> str:
        stack = self._pool.stack(worker)
        if stack is None:
            return (
                "No stack: the worker has not started running chute's code yet (it is "
                "still importing the main module or unpickling the pipeline)."
            )
        return f"Its Python stack, most recent call first:\n{stack}"
