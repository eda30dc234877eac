"""`NumpyDataSource`: rows of in-memory arrays or memory-mapped `.npy` files."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core.errors import DataError
from chute._src.storage.formats._concat import Concat
from chute._src.storage.formats._file_guard import FileGuard
from chute._src.storage.formats._paths import expand_paths
from chute._src.storage.remote.file import RemoteFile
from chute._src.storage.remote.urls import StorageOptions, is_url

__all__ = ["NumpyDataSource"]

_lseek = os.lseek
_SEEK_END = os.SEEK_END


class _RemoteRows:
    """The rows of a remote `.npy` file, read by ranges (header parsed once)."""

    def __init__(self, f: RemoteFile) -> None:
        with f.reader(1 << 16) as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            self.offset = fh.tell()
        if dtype.hasobject:
            raise ValueError("it holds Python objects")
        if not shape:
            raise ValueError("it holds a 0-d array")
        if fortran and len(shape) > 1:
            raise ValueError("it is in Fortran order; re-save it C-ordered to read rows")
        self.f, self.shape, self.dtype = f, tuple(shape), dtype
        self.row = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if self.offset + shape[0] * self.row > f.size:
            raise ValueError(f"it is shorter ({f.size} bytes) than its header says")
        self.ndim = len(shape)

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, rows: Sequence[int]) -> list[np.ndarray]:
        o, r = self.offset, self.row
        datas = self.f.read_ranges([(o + i * r, o + (i + 1) * r) for i in rows])
        return [np.frombuffer(d, self.dtype).reshape(self.shape[1:]).copy() for d in datas]

    def __getitem__(self, i: int) -> np.ndarray:
        return self.take([i])[0]


def _load_remote(path: str, storage: Any) -> _RemoteRows:
    f = RemoteFile(path, storage, "a .npy file")
    try:
        return _RemoteRows(f)
    except Exception as e:
        raise DataError(
            f"{path}: not a readable .npy file ({type(e).__name__}: {e}); it is truncated, "
            "corrupt, holds Python objects (which chute does not unpickle) or is not a "
            ".npy; re-save it with numpy.save"
        ) from None


def _load(path: str) -> tuple[np.ndarray, FileGuard]:
    guard = FileGuard(path, "a .npy file")  # names a missing, directory or unreadable path
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:  # ValueError, EOFError, tokenize.TokenError, SyntaxError, ...
        guard.close()
        raise DataError(
            f"{path}: not a readable .npy file ({type(e).__name__}: {e}); it is truncated, "
            "corrupt, holds Python objects (which chute does not unpickle) or is not a "
            ".npy; re-save it with numpy.save"
        ) from None
    if not isinstance(arr, np.ndarray) or arr.ndim == 0:
        guard.close()
        raise DataError(
            f"{path}: a NumpyDataSource file must hold an array with at least one "
            "dimension (rows are its records); save a stacked array with numpy.save"
        )
    return arr, guard


class NumpyDataSource:
    """The rows (first axis) of NumPy arrays as records.

    `data` is an array, a `.npy` path or glob, or a list of either; files are memory
    mapped lazily and their rows concatenated. Rows are returned as arrays: views of
    in-memory arrays, copies for files (a view into the map would crash the process
    with SIGBUS if the file were truncated while the row is held). Each read (or block
    of reads) first makes sure that no file has shrunk since it was mapped (a flag test
    while chute holds a lease on it, else a size check), raising `chute.DataError` if
    one has. Picklable: files reopen in the new process.

    >>> src = NumpyDataSource(np.arange(12).reshape(4, 3))
    >>> len(src), src[1].tolist(), [r.tolist() for r in src.__getitems__([3, 0])]
    (4, [3, 4, 5], [[9, 10, 11], [0, 1, 2]])
    """

    def __init__(
        self,
        data: np.ndarray | str | os.PathLike[str] | Sequence[np.ndarray | str],
        *,
        storage_options: StorageOptions = None,
    ) -> None:
        self._storage = dict(storage_options or {})
        items: list[Any] = (
            [data] if isinstance(data, np.ndarray | str | os.PathLike) else list(data)
        )
        self._items: list[np.ndarray | str] = []
        for item in items:
            if isinstance(item, np.ndarray):
                if item.ndim == 0:
                    raise ValueError("NumpyDataSource needs arrays with at least one dimension")
                self._items.append(item)
            else:
                self._items.extend(expand_paths(item, "NumpyDataSource", self._storage))
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._arrays: list[Any] | None = None  # arrays, maps, or _RemoteRows
        self._guards: list[FileGuard | None] = []
        self._concat = Concat([])

    def __getstate__(self) -> dict[str, Any]:
        return {"items": self._items, "storage": self._storage}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._items = state["items"]
        self._storage = state["storage"]
        self._init_runtime()

    def _open(self) -> list[Any]:
        with self._lock:
            if self._arrays is None:
                arrays: list[Any] = []
                guards: list[FileGuard | None] = []
                try:
                    for x in self._items:
                        if isinstance(x, np.ndarray):
                            arrays.append(x)
                            guards.append(None)
                        elif is_url(x):
                            arrays.append(_load_remote(x, self._storage))
                            guards.append(None)
                        else:
                            arr, guard = _load(x)
                            arrays.append(arr)
                            guards.append(guard)
                except BaseException:
                    for g in guards:
                        if g is not None:
                            g.close()
                    raise
                self._concat = Concat([len(a) for a in arrays])
                self._guards = guards
                self._arrays = arrays
            return self._arrays

    def __len__(self) -> int:
        self._arrays or self._open()
        return len(self._concat)

    def _check(self, k: int, i: int) -> bool:
        """True if array k is a file (rows are then copied); raises if it shrank."""
        guard = self._guards[k]
        if guard is None:
            return False
        if not guard.leased and _lseek(guard.fd, 0, _SEEK_END) < guard.size:  # else SIGBUS
            raise guard.error(i)
        return True

    def __getitem__(self, index: int) -> np.ndarray:
        arrays = self._arrays or self._open()
        k, i = self._concat.locate(index, self)
        if isinstance(arrays[k], _RemoteRows):
            return arrays[k][i]
        if self._check(k, i):
            return np.array(arrays[k][i])
        return np.asarray(arrays[k][i])

    def __getitems__(self, indices: Sequence[int]) -> list[np.ndarray]:
        arrays = self._arrays or self._open()
        if len(arrays) == 1 and isinstance(arrays[0], _RemoteRows):
            return arrays[0].take([self._concat.locate(int(i), self)[1] for i in indices])
        if len(arrays) == 1:
            idx = np.asarray(indices, dtype=np.int64)
            if len(idx) and (idx.min() < -len(arrays[0]) or idx.max() >= len(arrays[0])):
                raise IndexError(f"an index of {indices!r} is out of range for {self!r}")
            if len(idx):
                self._check(0, int(idx[0]))
            return list(np.asarray(arrays[0][idx]))  # fancy indexing copies
        return [self[i] for i in indices]

    def __repr__(self) -> str:
        parts = [
            repr(x) if isinstance(x, str) else f"<array {x.dtype}{list(x.shape)}>"
            for x in self._items[:2]
        ]
        more = ", ..." if len(self._items) > 2 else ""
        return f"NumpyDataSource([{', '.join(parts)}{more}])"
