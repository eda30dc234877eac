"""Pickling a pipeline for worker processes, naming the stage that cannot be pickled.

cloudpickle (a dependency) pickles lambdas, local functions and functions of the main
script by value, so pipelines written inline work with workers; should it be missing,
the standard pickle is used, which needs functions defined at module level.

A pipeline that cannot be pickled raises the pickler's own exception (as Grain's
`mp_prefetch` does), with a note naming the stage and the fix.

`referenced_modules` says which modules unpickling a pipeline imports, so that the process
workers are forked from can import them once for all of them.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import types
from typing import Any

from chute._src.exec.mp.sync_objects import REDUCERS

# How much of a pipeline's pickle `referenced_modules` writes before it stops: the classes
# and functions come with the stages, a source's data (a long list) after them.
REFERENCES_BUDGET_BYTES = 1 << 20


def _pickler() -> Any:
    try:
        import cloudpickle
    except ImportError:
        return pickle
    return cloudpickle


class _PlainPickler(pickle.Pickler):
    """The standard pickler (no cloudpickle), with `sync_objects.REDUCERS`."""

    dispatch_table = {**copyreg.dispatch_table, **REDUCERS}


def _plain_dumps(obj: Any) -> bytes:
    buffer = io.BytesIO()
    _PlainPickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


def dumps(obj: Any, stages: list[Any], what: str = "mp_prefetch: stage") -> bytes:
    """Pickles `obj`; on failure adds a note to the pickler's exception naming the first
    of `stages` (sources first) that fails."""
    pickler = _pickler()
    try:
        if pickler is pickle:
            return _plain_dumps(obj)
        from chute._src.exec.mp import by_value  # keeps each function's file name

        return by_value.dumps(obj)
    except Exception as e:
        culprit = next((s for s in stages if not _picklable(pickler, s)), None)
        # A stage moved into the workers is named as the user wrote it (a MapIterDataset
        # computed there as a MapMapDataset).
        name = getattr(culprit, "_moved_from", None) or repr(culprit)
        where = f"{what} {name}" if culprit is not None else "the pipeline"
        fix = (
            "define the functions it uses at module level (lambdas and local functions "
            "cannot be pickled by the standard pickle), or pip install cloudpickle"
            if pickler is pickle
            else "make the objects it holds picklable (open files, sockets, multiprocessing "
            "queues and the locks of its default 'fork' context are not: open them lazily "
            "in the worker, e.g. in __setstate__, or take locks and events from "
            "multiprocessing.get_context('spawn'))"
        )
        grain_words = (
            f" (In Grain's words: Dataset: {name} cannot be pickled!)"
            if culprit is not None
            else ""
        )
        e.add_note(
            f"chute: {where} cannot be pickled, so it cannot be sent to worker processes: "
            f"{fix}.{grain_words}"
        )
        raise


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def _picklable(pickler: Any, obj: Any) -> bool:
    try:
        if pickler is pickle:
            _plain_dumps(obj)
        else:
            from chute._src.exec.mp import by_value

            by_value.dumps(obj)
    except Exception:
        return False
    return True


class _Enough(Exception):
    pass


class _CountingSink:
    """A file that keeps nothing, and stops the pickler past `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def write(self, data: Any) -> int:
        n = len(data)
        self.left -= n
        if self.left < 0:
            raise _Enough
        return n


def referenced_modules(obj: Any, budget_bytes: int = REFERENCES_BUDGET_BYTES) -> list[str]:
    """The modules of the classes, functions and modules `obj`'s pickle refers to, in the
    order met: those unpickling it imports. Pickling stops after `budget_bytes` (a source
    holding much data) or at what cannot be pickled; what was met until then is returned,
    and nothing is raised. Only modules imported here are named, never `__main__`."""
    base = _pickler().Pickler
    found: dict[str, None] = {}

    class Recorder(base):  # type: ignore[misc, valid-type]
        def reducer_override(self, o: Any) -> Any:
            if isinstance(o, types.ModuleType):
                found[o.__name__] = None
            else:
                module = getattr(o, "__module__", None) if callable(o) else None
                for name in (module, type(o).__module__):
                    if isinstance(name, str):
                        found[name] = None
            parent = getattr(super(), "reducer_override", None)
            return parent(o) if parent is not None else NotImplemented

    try:
        Recorder(_CountingSink(budget_bytes), protocol=5).dump(obj)
    except Exception:
        pass  # an unpicklable stage is reported when the workers start; _Enough: done
    skip = ("__main__", "__mp_main__", "builtins")
    return [m for m in found if m in sys.modules and m not in skip]
