"""Pickling a pipeline for worker processes, naming the stage that cannot be pickled.

cloudpickle (a dependency) pickles lambdas, local functions and functions of the main
script by value, so pipelines written inline work with workers; should it be missing,
the standard pickle is used, which needs functions defined at module level.

A pipeline that cannot be pickled raises the pickler's own exception (as Grain's
`mp_prefetch` does), with a note naming the stage and the fix.
"""

from __future__ import annotations

import pickle
from typing import Any


def _pickler() -> Any:
    try:
        import cloudpickle
    except ImportError:
        return pickle
    return cloudpickle


def dumps(obj: Any, stages: list[Any], what: str = "mp_prefetch: stage") -> bytes:
    """Pickles `obj`; on failure adds a note to the pickler's exception naming the first
    of `stages` (sources first) that fails."""
    pickler = _pickler()
    try:
        return pickler.dumps(obj, protocol=5)
    except Exception as e:
        culprit = next((s for s in stages if not _picklable(pickler, s)), None)
        where = f"{what} {culprit!r}" if culprit is not None else "the pipeline"
        fix = (
            "define the functions it uses at module level (lambdas and local functions "
            "cannot be pickled by the standard pickle), or pip install cloudpickle"
            if pickler is pickle
            else "make the objects it holds picklable (open files, locks and sockets are "
            "not: open them lazily in the worker, e.g. in __setstate__)"
        )
        e.add_note(
            f"chute: {where} cannot be pickled, so it cannot be sent to worker processes: {fix}."
        )
        raise


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def _picklable(pickler: Any, obj: Any) -> bool:
    try:
        pickler.dumps(obj, protocol=5)
    except Exception:
        return False
    return True
