"""Sending `multiprocessing` locks, conditions, events and semaphores to chute's workers.

`multiprocessing` lets such an object go to a process only while it starts that process
(elsewhere pickling it raises "... should only be shared between processes through
inheritance"); the new process then opens the same semaphore by its name. chute's
workers start from a forkserver and receive their pipeline pickled, so `REDUCERS` pickle
these objects the same way: an object of a "spawn" or "forkserver" context reaches the
workers as the same lock or event. One of the default "fork" context (whose semaphore has
no name) raises `multiprocessing`'s own error; a Queue or Pipe, which would need an open
file handed over, still cannot be sent.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing import context as mp_context
from multiprocessing import synchronize
from typing import Any

__all__ = ["REDUCERS"]


class _Starting:
    """Stands for the process being started while an object is reduced; only objects that
    go by name are reduced under it (`REDUCERS`), so nothing asks it for a file."""


def _reduce(obj: Any) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    previous = mp_context.get_spawning_popen()
    mp_context.set_spawning_popen(_Starting())  # type: ignore[arg-type]
    try:
        state = obj.__getstate__()
    finally:
        mp_context.set_spawning_popen(previous)
    return _rebuild, (type(obj), state)


def _rebuild(cls: Any, state: Any) -> Any:
    obj = cls.__new__(cls)
    obj.__setstate__(state)
    return obj


REDUCERS: dict[type, Callable[[Any], Any]] = {
    cls: _reduce
    for cls in (
        synchronize.Lock,
        synchronize.RLock,
        synchronize.Semaphore,
        synchronize.BoundedSemaphore,
        synchronize.Condition,
    )
}
"""Reducers (a pickler's `dispatch_table`) for the objects that go by name. An `Event`
holds a condition and a semaphore, so it goes too."""
