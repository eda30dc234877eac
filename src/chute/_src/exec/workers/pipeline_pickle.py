"""Pickling a pipeline for worker processes, naming the stage that cannot be pickled.

cloudpickle (a dependency) pickles lambdas, local functions and functions of the main
script by value (`exec/mp/by_value.py`), so pipelines written inline work with workers.

A pipeline that cannot be pickled raises the pickler's own exception (as Grain's
`mp_prefetch` does), with a note naming the stage and the fix.

`referenced_modules` says which modules unpickling a pipeline imports, so that the process
workers are forked from can import them once for all of them.
"""

from __future__ import annotations

import pickle
import sys
import types
from typing import Any

import cloudpickle

from chute._src.exec.mp import by_value

# How much of a pipeline's pickle `referenced_modules` writes before it stops: the classes
# and functions come with the stages, a source's data (a long list) after them.
REFERENCES_BUDGET_BYTES = 1 << 20


def dumps(obj: Any, stages: list[Any], what: str = "mp_prefetch: stage") -> bytes:
    """Pickles `obj`; on failure adds a note to the pickler's exception naming the first
    of `stages` (sources first) that fails."""
    try:
        return by_value.dumps(obj)  # keeps each function's file name
    except Exception as e:
        culprit = next((s for s in stages if not _picklable(s)), None)
        # A stage moved into the workers is named as the user wrote it (a MapIterDataset
        # computed there as a MapMapDataset).
        name = getattr(culprit, "_moved_from", None) or repr(culprit)
        where = f"{what} {name}" if culprit is not None else "the pipeline"
        fix = (
            "make the objects it holds picklable (open files, sockets, multiprocessing "
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


def _picklable(obj: Any) -> bool:
    try:
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
    base = cloudpickle.Pickler
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
