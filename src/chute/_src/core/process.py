"""What this process is to a pipeline: one of how many processes that compute it.

The worker loop (`_src/exec/mp/_worker.py`) records, before its first task, how many
worker processes its pool has (`set_worker_count`); whatever sizes a resource per process
reads it (`worker_count`), rather than the worker loop knowing who does: the remote block
cache (`_src/storage/remote/blocks.py`) gives each worker its share of the default size,
so that the workers together hold what one process would.
"""

from __future__ import annotations

__all__ = ["set_worker_count", "worker_count"]

_worker_count = 1


def set_worker_count(count: int) -> None:
    """Called in a worker process, one of `count`, before it runs any task."""
    global _worker_count
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(
            f"set_worker_count({count!r}): the count of a pool's worker processes must be "
            "an int, 1 or more"
        )
    _worker_count = count


def worker_count() -> int:
    """The worker processes of the pool this process works in: 1 in a process that is
    not a pool's worker (the main process)."""
    return _worker_count
