"""Shared-memory containers, for code that hands data between its own processes:
`SharedMemoryArray` (a numpy array in a named segment), its `SharedMemoryArrayMetadata`,
and `SharedMemoryDataSource` (a `multiprocessing.shared_memory.ShareableList` usable as a
data source).

chute's own workers do not need them: `mp_prefetch` hands arrays over through its slabs
and shares large list sources by itself (`docs/design.md`).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Iterable, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class SharedMemoryArrayMetadata:
    """What another process needs to open a `SharedMemoryArray`: segment, shape, dtype."""

    name: str
    shape: Iterable[int]
    dtype: Any

    def close_and_unlink_shm(self) -> None:
        """Closes and removes the segment this metadata names."""
        shm = shared_memory.SharedMemory(self.name)
        shm.close()
        shm.unlink()


class SharedMemoryArray(np.ndarray):
    """A numpy array in a shared-memory segment; pickles as the segment's name, so another
    process on the machine maps it instead of copying it.

    The last process using it calls `unlink_on_del()`, or the segment outlives it.

    >>> a = SharedMemoryArray((2, 3), dtype=np.int32)
    >>> a[:] = 7
    >>> b = SharedMemoryArray.from_metadata(a.metadata)
    >>> int(b.sum())
    42
    >>> b.unlink_on_del()
    >>> del a, b
    """

    shm: shared_memory.SharedMemory | None
    _unlink_on_del: bool
    _owner: bool

    def __new__(cls, shape: Iterable[int], dtype: Any = float) -> SharedMemoryArray:
        shape = tuple(shape)
        size = max(1, math.prod(shape) * np.dtype(dtype).itemsize)
        return cls.from_shared_memory(
            shared_memory.SharedMemory(create=True, size=size), shape, dtype
        )

    def __array_finalize__(self, obj: Any) -> None:
        shm = getattr(obj, "shm", None)
        self.shm = shm if shm is not None and np.may_share_memory(self, obj) else None
        self._unlink_on_del = False
        self._owner = False

    def __array_wrap__(self, obj: Any, context: Any = None, return_scalar: bool = False) -> Any:
        if return_scalar:
            return obj[()]
        return np.asarray(obj)

    @classmethod
    def from_shared_memory(
        cls, shm: shared_memory.SharedMemory, shape: Any, dtype: Any
    ) -> SharedMemoryArray:
        obj = np.ndarray.__new__(cls, shape, dtype, buffer=shm.buf)
        obj.shm = shm
        obj._unlink_on_del = False
        obj._owner = True  # the array made on the segment; views share it, and never unlink
        return obj

    @classmethod
    def from_metadata(cls, metadata: SharedMemoryArrayMetadata) -> SharedMemoryArray:
        return cls.from_shared_memory(
            shared_memory.SharedMemory(metadata.name), metadata.shape, metadata.dtype
        )

    @property
    def metadata(self) -> SharedMemoryArrayMetadata:
        if self.shm is None:
            raise ValueError(
                "SharedMemoryArray: this array is a view that does not own its segment; take "
                "the metadata of the array made with SharedMemoryArray(shape, dtype)."
            )
        return SharedMemoryArrayMetadata(name=self.shm.name, shape=self.shape, dtype=self.dtype)

    @classmethod
    def enable_async_del(cls, num_threads: int = 1, max_outstanding_requests: int = 50) -> None:
        """Accepted for compatibility: chute closes segments when the array is deleted."""

    @classmethod
    def close_shm_async(cls, shm: shared_memory.SharedMemory, unlink: bool) -> None:
        """Closes `shm`, and removes it with `unlink` (at once: chute has no deletion pool)."""
        shm.close()
        if unlink:
            shm.unlink()

    def unlink_on_del(self) -> None:
        """Makes this array remove the segment when it is deleted (the mapping itself is
        closed when the last array viewing it is gone)."""
        self._unlink_on_del = True

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self.shm is None:
            return np.asarray(self).__reduce_ex__(protocol)
        return self.from_metadata, (self.metadata,)

    def __del__(self) -> None:
        shm = self.shm
        if shm is not None and getattr(self, "_owner", False) and self._unlink_on_del:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass


class SharedMemoryDataSource(shared_memory.ShareableList):
    """A data source of ints, floats, bools, strs, bytes or Nones held in shared memory:
    made from `elements`, or attached to an existing one by `name`.

    The source that made the segment removes it when it is garbage-collected or the
    process exits, whichever comes first (Grain's leaves that to `unlink()`, and Python's
    resource tracker warns of a leak at exit); one attached by name only closes its
    mapping. `close()` and `unlink()` may still be called, as with Grain's.

    >>> source = SharedMemoryDataSource([1, 2, 3])
    >>> len(source), source[1]
    (3, 2)
    >>> same = SharedMemoryDataSource(name=source.shm.name)
    >>> list(same)
    [1, 2, 3]
    >>> same.close(); source.close(); source.unlink()
    """

    def __init__(self, elements: Sequence[Any] | None = None, *, name: str | None = None) -> None:
        if elements is None and name is None:
            raise ValueError(
                "SharedMemoryDataSource: give elements=[...] to make one, or name=... to "
                "attach to one made elsewhere."
            )
        super().__init__(elements, name=name)
        weakref.finalize(self, _release, self.shm, elements is not None)

    def __reduce__(self) -> Any:
        return _attach, (self.shm.name,)

    def __str__(self) -> str:
        # As Grain prints it (its in-memory source is this class under another name).
        return f"InMemoryDataSource(name={self.shm.name}, len={len(self)})"

    def close(self) -> None:
        self.shm.close()

    def unlink(self) -> None:
        self.shm.unlink()


def _release(shm: shared_memory.SharedMemory, unlink: bool) -> None:
    shm.close()
    if unlink:
        try:
            shm.unlink()
        except FileNotFoundError:  # unlink() was called already
            pass


def _attach(name: str) -> SharedMemoryDataSource:
    return SharedMemoryDataSource(name=name)
