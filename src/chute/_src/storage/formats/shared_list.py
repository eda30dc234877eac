"""`SharedListSource`: a large in-memory list, shared by worker processes without copies.

Sending a Python list to worker processes the usual way pickles it whole, once per worker,
and each worker holds its own unpickled copy. `mp_prefetch` instead replaces a large list
or tuple source by this: every element pickled once, one after the other, into a file in
shared memory, with a table of offsets. Workers map the file and unpickle only the elements
they read, so their memory does not grow as they read it, whatever the number of workers.
The file is created 0600 (it holds the user's data) and removed when the workers stop.
Its creator holds a shared `fcntl.flock` on it for the file's whole life (on a descriptor
the `SharedListSource` keeps), so a file left by a killed process is the one file that can
be locked exclusively: the next time a file is made, files of this kind that can be locked
exclusively without waiting, and are older than a minute (not being created), are removed.
Nothing is decided by the process id in the name: `/dev/shm` may be shared by containers
whose processes this one cannot see.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import pickle
import re
import secrets
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core.shm_files import sweep_stale

_MAGIC = b"CHUTELST"
_PREFIX = "chute_list_"
_NAME = re.compile(rf"^{_PREFIX}\d+_[0-9a-f]+$")


def _directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class SharedListSource:
    """The elements of `items`, pickled one by one into a shared file, read by index."""

    def __init__(self, items: Sequence[Any]) -> None:
        directory = _directory()
        sweep_stale(directory, _NAME)
        self._n = n = len(items)
        self.path = os.path.join(directory, f"{_PREFIX}{os.getpid()}_{secrets.token_hex(8)}")
        self._owner = os.getpid()
        dumps = pickle.dumps
        parts = [dumps(x, protocol=5) for x in items]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=n), out=offsets[1:])
        offsets += 16 + 8 * (n + 1)
        # 0600 whatever the umask; the shared lock marks the file live for its whole life.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._lock_fd: int | None = fd
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            with open(os.dup(fd), "wb") as f:
                f.write(_MAGIC + n.to_bytes(8, "little"))
                f.write(offsets.tobytes())
                f.writelines(parts)
        except BaseException:
            self.unlink()
            raise
        self._mm: mmap.mmap | None = None
        self._offsets: np.ndarray | None = None

    def _open(self) -> tuple[mmap.mmap, np.ndarray]:
        if self._mm is None or self._offsets is None:
            with open(self.path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            if mm[:8] != _MAGIC:
                raise ValueError(f"{self.path} is not a chute shared list (bad magic)")
            self._offsets = np.frombuffer(mm, dtype=np.int64, count=self._n + 1, offset=16)
            self._mm = mm
        return self._mm, self._offsets

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> Any:
        mm, offsets = self._open()
        if index < 0:
            index += self._n
        return pickle.loads(mm[int(offsets[index]) : int(offsets[index + 1])])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        mm, offsets = self._open()
        idx = np.asarray(indices, dtype=np.int64)
        starts = offsets[idx].tolist()
        ends = offsets[idx + 1].tolist()
        loads = pickle.loads
        return [loads(mm[a:b]) for a, b in zip(starts, ends)]

    def unlink(self) -> None:
        """Removes the file (in the process that made it); readers keep their mapping."""
        if os.getpid() == self._owner and self._lock_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __del__(self) -> None:
        # Not unlinked: the lock goes with the descriptor, so a later sweep may remove it.
        fd = getattr(self, "_lock_fd", None)
        if fd is not None and os.getpid() == self._owner:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_n": self._n, "_owner": self._owner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._n = state["_n"]
        self._owner = state["_owner"]
        self._lock_fd = None  # only the creating object holds the lock
        self._mm = None
        self._offsets = None

    def __repr__(self) -> str:
        return f"SharedListSource(len={self._n})"
