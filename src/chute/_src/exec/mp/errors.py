"""The exceptions and the warning raised by the worker-process layer.

- `NotPicklableError`: a function handed to `WorkerPool` cannot be pickled, so it cannot
  reach a worker process. Raised by the constructor, before any process starts.
- `WorkerDiedError`: a worker process exited without being asked to (SIGKILL, the OOM
  killer, a crash in native code, `os._exit`). Raised by `WorkerPool.get`.
- `WorkerError`: a worker raised an exception whose type cannot be re-created in the main
  process (it cannot be pickled or unpickled). Exceptions that can be re-created are
  re-raised with their own type instead. Either way `__cause__` is a `RemoteTraceback`
  holding the worker's traceback text.
- `PoolClosedError`: `put` or `get` on a pool that is closed (explicitly, or because a
  worker failed).
- `PoolUsageError`: `put` beyond `buffer_size`, or `get` with nothing outstanding.
- `SharedMemoryWarning`: shared memory is too small, so results travel through pipes.
- `WorkerStallWarning`: a worker has produced nothing for a while; shows its stack.
- `WorkerTimeoutError`: a worker produced nothing within the timeout; names its stack.
"""

from __future__ import annotations

from chute._src.core.errors import ChuteError

__all__ = [
    "NotPicklableError",
    "PoolClosedError",
    "PoolUsageError",
    "RemoteTraceback",
    "SharedMemoryWarning",
    "WorkerDiedError",
    "WorkerError",
    "WorkerStallWarning",
    "WorkerTimeoutError",
]


class NotPicklableError(ChuteError, TypeError):
    """A callable or task that must be sent to a worker process cannot be pickled."""


class WorkerDiedError(ChuteError, RuntimeError):
    """A worker process exited unexpectedly (killed by a signal, crashed or exited)."""

    def __init__(self, message: str, *, worker_index: int, exitcode: int | None) -> None:
        super().__init__(message)
        self.worker_index = worker_index
        self.exitcode = exitcode


class WorkerError(ChuteError, RuntimeError):
    """A worker raised an exception that cannot be re-created in the main process."""


class PoolUsageError(ChuteError, RuntimeError):
    """`put` to a worker whose buffer is full, or `get` from one with nothing outstanding."""


class PoolClosedError(ChuteError, RuntimeError):
    """The pool is closed: it cannot take tasks or return results any more."""


class RemoteTraceback(Exception):
    """The traceback text of an exception raised in a worker process.

    Set as `__cause__` of the exception re-raised in the main process, so that the
    printed traceback shows where in the worker the error happened.
    """

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        # The frames only: the exception's own line and notes follow once, below, as
        # those of the exception re-raised in the main process.
        return f'\n"""\n{_frames_only(self.tb)}"""'


def _frames_only(tb: str) -> str:
    """`tb` (a formatted traceback) without the lines after its last frame."""
    lines = tb.splitlines(keepends=True)
    last = max((i for i, line in enumerate(lines) if line.startswith("  File ")), default=None)
    if last is None:
        return tb
    end = last + 1
    while end < len(lines) and lines[end].startswith("    "):
        end += 1
    return "".join(lines[:end])


class SharedMemoryWarning(UserWarning):
    """Shared memory is too small for the requested buffers; pipes are used instead."""


class WorkerStallWarning(UserWarning):
    """A worker has produced nothing for `stall_warning_s`; the message shows its stack."""


class WorkerTimeoutError(ChuteError, TimeoutError):
    """A worker produced nothing within `timeout_s`; the message shows its stack."""

    def __init__(self, message: str, *, worker_index: int) -> None:
        super().__init__(message)
        self.worker_index = worker_index
