"""Waiting for a worker's result within `MultiprocessingOptions.stall_warning_s` and
`timeout_s`: a `WorkerStallWarning` with the worker's Python stack while it produces
nothing, then a `WorkerTimeoutError`."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from chute._src.exec.mp.errors import WorkerStallWarning, WorkerTimeoutError
from chute._src.exec.mp.pool import WorkerPool

STILL_WAITING: Any = object()
"""What an attempt of `wait_bounded` returns when its wait ran out with no result."""


def wait_bounded(
    attempt: Callable[[float | None], Any],
    stall_warning_s: float | None,
    timeout_s: float | None,
    warn: Callable[[float], None],
    give_up: Callable[[float], NoReturn],
) -> Any:
    """`attempt(wait)`'s result, called again while it returns `STILL_WAITING`; `warn(s)`
    every `stall_warning_s` seconds without one and `give_up(s)` (which raises) after
    `timeout_s`. Every worker backend waits for its results through here."""
    next_warning = stall_warning_s
    t0 = time.monotonic()
    while True:
        marks = [m for m in (next_warning, timeout_s) if m is not None]
        wait = max(0.0, min(marks) - (time.monotonic() - t0)) if marks else None
        result = attempt(wait)
        if result is not STILL_WAITING:
            return result
        waited = time.monotonic() - t0
        if timeout_s is not None and waited >= timeout_s:
            give_up(waited)
        if next_warning is not None and stall_warning_s is not None and waited >= next_warning:
            next_warning += stall_warning_s
            warn(waited)


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

        def attempt(wait: float | None) -> Any:
            try:
                return self._pool.get(worker, timeout=wait)
            except TimeoutError:
                if self._pool.closed:
                    raise  # the worker's own TimeoutError, not ours
                return STILL_WAITING

        def give_up(waited: float) -> NoReturn:
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

        def warn(waited: float) -> None:
            warnings.warn(
                f"chute: {describe()} has produced nothing for {waited:.0f} s. "
                "If it is stuck, its stack below shows where; if the work is just slow, "
                "raise MultiprocessingOptions(stall_warning_s=...) above "
                f"{warn_every} (None turns this warning off). {self.stack(worker)}",
                WorkerStallWarning,
                stacklevel=5,
            )

        return wait_bounded(attempt, warn_every, limit, warn, give_up)

    def stack(self, worker: int) -> str:
        stack = self._pool.stack(worker)
        if stack is None:
            return (
                "No stack: the worker has not started running chute's code yet (it is "
                "still importing the main module or unpickling the pipeline)."
            )
        return f"Its Python stack, most recent call first:\n{stack}"
