"""Worker processes and the shared-memory transport that brings their results back.

Self-contained: nothing here knows about datasets. See README.md for the protocol.

The names below are imported on first use: a worker process imports `_worker` (and what it
needs) without the pool that starts workers.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from chute._src.exec.mp.errors import NotPicklableError as NotPicklableError
    from chute._src.exec.mp.errors import PoolClosedError as PoolClosedError
    from chute._src.exec.mp.errors import PoolUsageError as PoolUsageError
    from chute._src.exec.mp.errors import RemoteTraceback as RemoteTraceback
    from chute._src.exec.mp.errors import SharedMemoryWarning as SharedMemoryWarning
    from chute._src.exec.mp.errors import WorkerDiedError as WorkerDiedError
    from chute._src.exec.mp.errors import WorkerError as WorkerError
    from chute._src.exec.mp.errors import WorkerStallWarning as WorkerStallWarning
    from chute._src.exec.mp.errors import WorkerTimeoutError as WorkerTimeoutError
    from chute._src.exec.mp.pool import DEFAULT_START_METHOD as DEFAULT_START_METHOD
    from chute._src.exec.mp.pool import WorkerPool as WorkerPool

__all__ = [
    "DEFAULT_START_METHOD",
    "NotPicklableError",
    "PoolClosedError",
    "PoolUsageError",
    "RemoteTraceback",
    "SharedMemoryWarning",
    "WorkerDiedError",
    "WorkerError",
    "WorkerPool",
    "WorkerStallWarning",
    "WorkerTimeoutError",
]


# Defined for the interpreter only: type checkers see the imports above, so a
# misspelt name is an error there too.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> _typing.Any:
        if name not in __all__:
            raise AttributeError(f"module 'chute._src.exec.mp' has no attribute {name!r}")
        where = "pool" if name in ("DEFAULT_START_METHOD", "WorkerPool") else "errors"
        value = getattr(_importlib.import_module(f"chute._src.exec.mp.{where}"), name)
        globals()[name] = value
        return value
