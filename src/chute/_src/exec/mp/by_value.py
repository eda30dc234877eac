"""Pickling for worker processes: what lives in `__main__` (or a notebook cell, a lambda,
a local function) by value, everything else by module reference (cloudpickle, a
dependency). Workers never import the main script, so this is how its functions reach them.

cloudpickle names the code of a function it pickles by value `<dynamic-code>` (so that its
bytes do not depend on where it was defined); here each code object keeps its own file
name, so that a worker's traceback points at the user's file and line:

>>> import pickle
>>> f = lambda x: 1 / x
>>> pickle.loads(dumps(f)).__code__.co_filename == f.__code__.co_filename
True
"""

from __future__ import annotations

import io
import types
from collections import ChainMap
from typing import Any

import cloudpickle

from chute._src.exec.mp.sync_objects import REDUCERS

__all__ = ["dumps"]

_DYNAMIC = "<dynamic-code>"
_reduce_code = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _reduce_code_keeping_its_file(code: types.CodeType) -> Any:
    constructor, args = _reduce_code(code)
    return constructor, tuple(
        code.co_filename if isinstance(a, str) and a == _DYNAMIC else a for a in args
    )


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap(
        {types.CodeType: _reduce_code_keeping_its_file},
        REDUCERS,  # multiprocessing locks and events of a spawn/forkserver context
        cloudpickle.Pickler.dispatch_table,
    )


def dumps(obj: Any) -> bytes:
    """`obj` pickled (protocol 5) as described above; raises what the pickler raises."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()
