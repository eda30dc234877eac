"""The stores of `MapDataset.cache()`: `MemoryStore`, a dict in this process, and
`SharedStore`, shared by worker processes: one file in `/dev/shm` with no name.

    [header 64 B: magic, n, capacity, tail, count, max_elements]
    [index: n x (offset, length + 1) int64; 0 = not kept]
    [arena: elements encoded by `tree_codec` (no pickle), appended]

Any process reads a kept element through its own read-only map of the file (no lock:
a writer writes the element's bytes before its index entry, each with one `pwrite`).
Writes append under a lock (`fcntl.lockf` on the file, and a thread lock in each process)
with `pwrite`, never through the map, so a full `/dev/shm` fails the write with an
`OSError` (the element is then simply not kept) instead of faulting a mapped page. The
bound is `capacity` bytes of encoded elements and `max_elements`; past it, nothing more
is kept.

The file has no name (`core/shm_files.anonymous_file`): the process that owns the dataset
holds its descriptor while the dataset lives, each worker process the copy handed to it
as it starts (`core/shm_files`: the store pickles as a key), and the kernel frees the
memory with the last of them, however they end. Unpickled in a process it was not handed
to (a Ray actor, a copy pickled by hand), the store is an empty `MemoryStore` of that
process: the cache never changes the elements, only how often they are computed.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import secrets
import struct
import sys
import threading
import weakref
from typing import Any, Protocol

import numpy as np

from chute._src.core import shm_files, tree, tree_codec

_MAGIC = b"CHUTECAC"
_HEADER = 64
_FIELDS = struct.Struct("<8s5q")  # magic, n, capacity, tail, count, max_elements
_POS = struct.Struct("<2q")  # tail, count at offset 24
_I64 = struct.Struct("<q")
_DIRECTORY = "/dev/shm"


MISSING: Any = object()
"""What a store's `get` returns for a position it does not keep."""


def element_bytes(element: Any) -> int:
    """The memory an element holds: its arrays' bytes, other leaves' own size."""
    total = 0
    for leaf in tree.leaves(element):
        total += leaf.nbytes if isinstance(leaf, np.ndarray) else sys.getsizeof(leaf)
    return total


class Store(Protocol):
    """Where a cache keeps elements by position."""

    def get(self, position: int) -> Any:
        """The element kept at `position`, or `MISSING`."""

    def put(self, position: int, element: Any) -> None:
        """Keeps `element` if the bound allows; otherwise does nothing."""

    def stats(self) -> tuple[int, int]:
        """(elements kept, bytes kept)."""


class MemoryStore:
    """A dict in this process, up to `max_elements` and `max_bytes`."""

    def __init__(self, max_elements: int | None, max_bytes: int) -> None:
        self.max_elements, self.max_bytes = max_elements, max_bytes
        self._items: dict[int, Any] = {}
        self._bytes = 0
        self._full = False
        self._lock = threading.Lock()

    def get(self, position: int) -> Any:
        return self._items.get(position, MISSING)

    def put(self, position: int, element: Any) -> None:
        if self._full:
            return
        size = element_bytes(element)
        with self._lock:
            if position in self._items:
                return
            if self._bytes + size > self.max_bytes or (
                self.max_elements is not None and len(self._items) >= self.max_elements
            ):
                # Kept elements stay; a smaller element may still fit under max_bytes.
                self._full = self.max_elements is not None and len(self._items) >= self.max_elements
                return
            self._items[position] = element
            self._bytes += size

    def stats(self) -> tuple[int, int]:
        return len(self._items), self._bytes

    def items(self) -> list[tuple[int, Any]]:
        with self._lock:
            return list(self._items.items())

    def __getstate__(self) -> dict[str, Any]:  # a copy sent elsewhere starts empty
        return {"max_elements": self.max_elements, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["max_elements"], state["max_bytes"])  # type: ignore[misc]


def shared_memory_available() -> bool:
    return os.name == "posix" and os.path.isdir(_DIRECTORY) and os.access(_DIRECTORY, os.W_OK)


def _release(fd: int, mm: mmap.mmap) -> None:
    with contextlib.suppress(BufferError, ValueError):
        mm.close()  # BufferError: an element still views it; the map goes with the process
    with contextlib.suppress(OSError):
        os.close(fd)


def _data_offset(n: int) -> int:
    return -(-(_HEADER + 16 * n) // 64) * 64


class SharedStore:
    """Elements by position in a shared file; see the module docstring."""

    def __init__(self, n: int, max_elements: int | None, capacity: int) -> None:
        shm_files.sweep_left_behind(_DIRECTORY)
        free = os.statvfs(_DIRECTORY)
        capacity = min(capacity, free.f_bavail * free.f_frsize // 2)
        self.n, self.capacity, self.max_elements = n, max(0, capacity), max_elements
        self._data = _data_offset(n)
        self._key = secrets.token_hex(8)
        fd = shm_files.anonymous_file(_DIRECTORY, "chute_cache_")
        try:
            os.ftruncate(fd, self._data + self.capacity)
            limit = -1 if max_elements is None else max_elements
            os.pwrite(fd, _FIELDS.pack(_MAGIC, n, self.capacity, 0, 0, limit), 0)
        except BaseException:
            os.close(fd)
            raise
        self._open(fd)

    @classmethod
    def _attach(cls, fd: int, key: str, n: int, capacity: int, max_elements: int | None) -> Any:
        magic, found_n, found_capacity, *_ = _FIELDS.unpack(os.pread(fd, _FIELDS.size, 0))
        if magic != _MAGIC or found_n != n or found_capacity != capacity:
            os.close(fd)
            raise RuntimeError(
                f"chute: the cache file handed over as {key!r} holds {found_n} positions and "
                f"{found_capacity} bytes, not the {n} and {capacity} its dataset made"
            )
        store = cls.__new__(cls)
        store.n, store.capacity, store.max_elements = n, capacity, max_elements
        store._data, store._key = _data_offset(n), key
        store._open(fd)
        return store

    def _open(self, fd: int) -> None:
        self._fd = fd
        self._mm = mmap.mmap(fd, self._data + self.capacity, prot=mmap.PROT_READ)
        self._index = np.frombuffer(self._mm, dtype=np.int64, count=2 * self.n, offset=_HEADER)
        self._lock = threading.Lock()
        self._full = False
        weakref.finalize(self, _release, fd, self._mm)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        shm_files.hand_over(self._key, self._fd, self)
        return _attach, (self._key, self.n, self.capacity, self.max_elements)

    def get(self, position: int) -> Any:
        length = int(self._index[2 * position + 1])
        if not length:
            return MISSING
        offset = self._data + int(self._index[2 * position])
        return tree_codec.decode(self._mm[offset : offset + length - 1])

    def put(self, position: int, element: Any) -> None:
        if self._full or self._index[2 * position + 1]:
            return
        try:
            data = tree_codec.encode(element)
        except TypeError:
            return  # not storable without pickle: computed again when read
        fd = self._fd
        with self._lock:
            fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0)
            try:
                if self._index[2 * position + 1]:
                    return
                tail, count = _POS.unpack(os.pread(fd, _POS.size, 24))
                over = self.max_elements is not None and count >= self.max_elements
                if over or tail + len(data) > self.capacity:
                    self._full = over
                    return
                try:
                    os.pwrite(fd, data, self._data + tail)
                    # The offset before the length: a reader trusts an entry once its
                    # length is set.
                    os.pwrite(fd, _I64.pack(tail), _HEADER + 16 * position)
                    os.pwrite(fd, _I64.pack(len(data) + 1), _HEADER + 16 * position + 8)
                    os.pwrite(fd, _POS.pack(tail + len(data), count + 1), 24)
                except OSError:  # /dev/shm is full: keep nothing more
                    self._full = True
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0)

    def stats(self) -> tuple[int, int]:
        tail, count = _POS.unpack(os.pread(self._fd, _POS.size, 24))
        return count, tail


def _attach(key: str, n: int, capacity: int, max_elements: int | None) -> Any:
    """The store handed to this process under `key`, or an empty one of its own."""
    fd = shm_files.received(key)
    if fd is None:
        return MemoryStore(max_elements, capacity)
    return SharedStore._attach(fd, key, n, capacity, max_elements)
