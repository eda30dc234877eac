"""`NumpyDataSource`: rows of in-memory arrays or memory-mapped `.npy` files."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.errors import DataError
from chute._src.sources._concat import Concat
from chute._src.sources._paths import expand_paths

__all__ = ["NumpyDataSource"]


def _load(path: str) -> np.ndarray:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(
            f"{path}: not a readable .npy file ({e}); it is truncated, corrupt, holds "
            "Python objects (which chute does not unpickle) or is not a .npy; re-save it "
            "with numpy.save"
        ) from None
    if not isinstance(arr, np.ndarray) or arr.ndim == 0:
        raise DataError(
            f"{path}: a NumpyDataSource file must hold an array with at least one "
            "dimension (rows are its records); save a stacked array with numpy.save"
        )
    return arr


class NumpyDataSource:
    """The rows (first axis) of NumPy arrays as records.

    `data` is an array, a `.npy` path or glob, or a list of either; files are memory
    mapped lazily and their rows concatenated. Rows are returned as arrays (views into
    the mapping for files). Picklable: files reopen in the new process.

    >>> src = NumpyDataSource(np.arange(12).reshape(4, 3))
    >>> len(src), src[1].tolist(), [r.tolist() for r in src.__getitems__([3, 0])]
    (4, [3, 4, 5], [[9, 10, 11], [0, 1, 2]])
    """

    def __init__(
        self, data: np.ndarray | str | os.PathLike[str] | Sequence[np.ndarray | str]
    ) -> None:
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
                self._items.extend(expand_paths(item, "NumpyDataSource"))
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._arrays: list[np.ndarray] | None = None
        self._concat = Concat([])

    def __getstate__(self) -> dict[str, Any]:
        return {"items": self._items}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._items = state["items"]
        self._init_runtime()

    def _open(self) -> list[np.ndarray]:
        with self._lock:
            if self._arrays is None:
                arrays = [x if isinstance(x, np.ndarray) else _load(x) for x in self._items]
                self._concat = Concat([len(a) for a in arrays])
                self._arrays = arrays
            return self._arrays

    def __len__(self) -> int:
        self._arrays or self._open()
        return len(self._concat)

    def __getitem__(self, index: int) -> np.ndarray:
        arrays = self._arrays or self._open()
        k, i = self._concat.locate(index, self)
        return np.asarray(arrays[k][i])

    def __getitems__(self, indices: Sequence[int]) -> list[np.ndarray]:
        arrays = self._arrays or self._open()
        if len(arrays) == 1:
            idx = np.asarray(indices, dtype=np.int64)
            if len(idx) and (idx.min() < -len(arrays[0]) or idx.max() >= len(arrays[0])):
                raise IndexError(f"an index of {indices!r} is out of range for {self!r}")
            return list(np.asarray(arrays[0][idx]))
        return [self[i] for i in indices]

    def __repr__(self) -> str:
        parts = [
            repr(x) if isinstance(x, str) else f"<array {x.dtype}{list(x.shape)}>"
            for x in self._items[:2]
        ]
        more = ", ..." if len(self._items) > 2 else ""
        return f"NumpyDataSource([{', '.join(parts)}{more}])"
