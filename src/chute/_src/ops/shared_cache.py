"""The store of `MapDataset.cache()` shared by worker processes: one file in `/dev/shm`.

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

The file is made 0600 by the process that owns the dataset, which holds a shared `flock`
on it while it lives and removes it when the dataset is garbage collected; the next store
made removes files of this kind that no live process holds (left by a killed one), as
`SharedListSource` does for its files.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import secrets
import struct
import threading
import weakref
from typing import Any

import numpy as np

from chute._src.core import tree_codec
from chute._src.core.shm_files import sweep_stale
from chute._src.ops.cache import MISSING

_MAGIC = b"CHUTECAC"
_PREFIX = "chute_cache_"
_NAME = re.compile(rf"^{_PREFIX}\d+_[0-9a-f]+$")
_HEADER = 64
_FIELDS = struct.Struct("<8s5q")  # magic, n, capacity, tail, count, max_elements
_POS = struct.Struct("<2q")  # tail, count at offset 24
_I64 = struct.Struct("<q")
_DIRECTORY = "/dev/shm"


def shared_memory_available() -> bool:
    return os.name == "posix" and os.path.isdir(_DIRECTORY) and os.access(_DIRECTORY, os.W_OK)


def _release(fd: int, mm: mmap.mmap, path: str | None) -> None:
    with contextlib.suppress(BufferError, ValueError):
        mm.close()  # BufferError: an element still views it; the map goes with the process
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)
    with contextlib.suppress(OSError):
        os.close(fd)


class SharedStore:
    """Elements by position in a shared file; see the module docstring."""

    def __init__(self, n: int, max_elements: int | None, capacity: int) -> None:
        sweep_stale(_DIRECTORY, _NAME)
        free = os.statvfs(_DIRECTORY)
        capacity = min(capacity, free.f_bavail * free.f_frsize // 2)
        self.n, self.capacity, self.max_elements = n, max(0, capacity), max_elements
        self._data = -(-(_HEADER + 16 * n) // 64) * 64
        path = os.path.join(_DIRECTORY, f"{_PREFIX}{os.getpid()}_{secrets.token_hex(8)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(
                fd, fcntl.LOCK_SH
            )  # held while this process lives (see shm_files.sweep_stale)
            os.ftruncate(fd, self._data + self.capacity)
            limit = -1 if max_elements is None else max_elements
            os.pwrite(fd, _FIELDS.pack(_MAGIC, n, self.capacity, 0, 0, limit), 0)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        self.path = path
        self._open(fd, owner=True)

    def _open(self, fd: int, owner: bool) -> None:
        self._fd = fd
        self._mm = mmap.mmap(fd, self._data + self.capacity, prot=mmap.PROT_READ)
        self._index = np.frombuffer(self._mm, dtype=np.int64, count=2 * self.n, offset=_HEADER)
        self._lock = threading.Lock()
        self._full = False
        weakref.finalize(self, _release, fd, self._mm, self.path if owner else None)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "n": self.n,
            "capacity": self.capacity,
            "max_elements": self.max_elements,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.n = state["path"], state["n"]
        self.capacity, self.max_elements = state["capacity"], state["max_elements"]
        self._data = -(-(_HEADER + 16 * self.n) // 64) * 64
        fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        magic, n, capacity, *_ = _FIELDS.unpack(os.pread(fd, _FIELDS.size, 0))
        if magic != _MAGIC or n != self.n or capacity != self.capacity:
            os.close(fd)
            raise RuntimeError(f"{self.path} is not the cache file this dataset made")
        self._open(fd, owner=False)

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
