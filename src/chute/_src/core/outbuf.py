"""Where stages build large arrays: in a worker process, in its shared-memory slab.

A worker installs its `ResultSender.allocate_array` here while it runs. `empty` then
places arrays of at least `MIN_BYTES` in the slab, so a result holding one reaches the
main process without a copy; anywhere else (the main process, a thread a stage started,
a full slab) it is `np.empty`. `batch` stacks into `empty`, so the one copy that
stacking makes anyway is also the copy into shared memory.

It is a hook with no dependency: `tree.stack` and the operations build through it, and
the worker loop (`_src/exec/mp/_worker.py`) installs the allocator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["MIN_BYTES", "empty", "install", "stack"]

# Below this, copying into the slab at send time costs less than a region of its own.
MIN_BYTES = 256 << 10

_Allocate = Callable[[tuple[int, ...], "np.dtype[Any]"], "np.ndarray | None"]
_allocate: _Allocate | None = None
_thread: int | None = None


def install(allocate: _Allocate | None) -> None:
    """Makes `empty` use `allocate` on the calling thread (None: stop)."""
    global _allocate, _thread
    _allocate = allocate
    _thread = threading.get_ident() if allocate is not None else None


def empty(shape: int | tuple[int, ...], dtype: Any = float) -> np.ndarray:
    """Like `np.empty` (C order); in a chute worker, large arrays go to shared memory.

    A worker hands such an array to the main process without copying it, so a stage that
    builds a large output in it (decoding an image, reading a record, stacking a batch)
    saves one copy of every byte. Once a worker has returned the array, it belongs to
    the consumer: the stage must not keep writing into it.

    >>> empty((2, 3), np.int32).shape
    (2, 3)
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dt = np.dtype(dtype)
    allocate = _allocate
    if allocate is not None and not dt.hasobject and threading.get_ident() == _thread:
        nbytes = dt.itemsize
        for n in shape:
            nbytes *= n
        if nbytes >= MIN_BYTES:
            out = allocate(shape, dt)
            if out is not None:
                return out
    return np.empty(shape, dt)


def stack(arrays: Sequence[Any]) -> np.ndarray:
    """`np.stack` of same-shaped arrays, into `empty` when that is shared memory."""
    if _allocate is None or threading.get_ident() != _thread:
        return np.stack(arrays)
    first = arrays[0]
    if not isinstance(first, np.ndarray):
        return np.stack(arrays)
    if first.nbytes * len(arrays) < MIN_BYTES or first.dtype.hasobject:
        return np.stack(arrays)
    dtype = first.dtype
    if not all(isinstance(a, np.ndarray) and a.dtype == dtype for a in arrays):
        return np.stack(arrays)  # mixed types: let numpy promote
    out = empty((len(arrays), *first.shape), dtype)
    return np.stack(arrays, out=out)
