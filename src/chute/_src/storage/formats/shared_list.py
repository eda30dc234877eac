"""`SharedListSource`: a large in-memory list, shared by worker processes without copies.

Sending a Python list to worker processes the usual way pickles it whole, once per worker,
and each worker holds its own unpickled copy. `mp_prefetch` instead replaces a large list
or tuple source by this: every element pickled once, one after the other, into a file in
shared memory, with a table of offsets. Workers map the file and unpickle only the elements
they read, so their memory does not grow as they read it, whatever the number of workers.

The file has no name (`core/shm_files.anonymous_file`, 0600: it holds the user's data):
the process that made it holds its descriptor until the workers stop (`unlink`), each
worker the copy handed to it as it starts (the source pickles as a key,
`core/shm_files`), and the kernel frees it with the last of them, however they end.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import secrets
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core import shm_files

_MAGIC = b"CHUTELST"


def _directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class SharedListSource:
    """The elements of `items`, pickled one by one into a shared file, read by index."""

    def __init__(self, items: Sequence[Any]) -> None:
        directory = _directory()
        shm_files.sweep_left_behind(directory)
        self._n = n = len(items)
        self._key = secrets.token_hex(8)
        dumps = pickle.dumps
        parts = [dumps(x, protocol=5) for x in items]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=n), out=offsets[1:])
        offsets += 16 + 8 * (n + 1)
        fd = shm_files.anonymous_file(directory, "chute_list_")
        try:
            with open(os.dup(fd), "wb") as f:
                f.write(_MAGIC + n.to_bytes(8, "little"))
                f.write(offsets.tobytes())
                f.writelines(parts)
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self._mm: mmap.mmap | None = None
        self._offsets: np.ndarray | None = None

    def _open(self) -> tuple[mmap.mmap, np.ndarray]:
        if self._mm is None or self._offsets is None:
            if self._fd is None:
                raise ValueError(f"{self!r} was released (its workers stopped): it holds nothing")
            mm = mmap.mmap(self._fd, 0, prot=mmap.PROT_READ)
            if mm[:8] != _MAGIC:
                raise ValueError(f"{self!r}: its file is not a chute shared list (bad magic)")
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
        """Lets go of the file in this process (the workers have stopped); the kernel
        frees it once no process holds it."""
        self._offsets = None
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._fd is None:
            raise ValueError(f"{self!r} was released (its workers stopped): it cannot be sent")
        shm_files.hand_over(self._key, self._fd, self)
        return _attach, (self._key, self._n)

    def __repr__(self) -> str:
        return f"SharedListSource(len={self._n})"


def _attach(key: str, n: int) -> SharedListSource:
    """The list handed to this process under `key` (as a worker starts)."""
    fd = shm_files.received(key)
    if fd is None:
        raise RuntimeError(
            f"SharedListSource(len={n}) reached a process it was not handed to: it lives in "
            "shared memory for the worker processes chute starts for it, which receive it as "
            "they start. Pickle the original list or tuple instead."
        )
    source = SharedListSource.__new__(SharedListSource)
    source._n, source._key, source._fd = n, key, fd
    source._mm = None
    source._offsets = None
    return source
