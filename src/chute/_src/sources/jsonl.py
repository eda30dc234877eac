"""`JsonlDataSource`: random access to JSON Lines files through a line-offset index."""

from __future__ import annotations

import array
import mmap
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.errors import DataError
from chute._src.sources._concat import Concat
from chute._src.sources._index_cache import cached_index
from chute._src.sources._paths import PathsArg, expand_paths

__all__ = ["JsonlDataSource"]

try:
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson is in the test extra
    import json

    _loads = json.loads

_CHUNK = 16 << 20


def _line_index(path: str) -> np.ndarray:
    """Start and end (exclusive, without `\\r\\n`) of every non-blank line: shape (n, 2)."""
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    pos = 0
    line_start = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            nl = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10) + pos
            if len(nl):
                starts.append(np.concatenate([[line_start], nl[:-1] + 1]))
                ends.append(nl)
                line_start = int(nl[-1]) + 1
            pos += len(chunk)
    if pos > line_start:
        starts.append(np.array([line_start]))
        ends.append(np.array([pos]))
    if not starts:
        return np.zeros((0, 2), dtype=np.int64)
    s = np.concatenate(starts).astype(np.int64)
    e = np.concatenate(ends).astype(np.int64)
    # Drop a trailing '\r' (CRLF files) and blank lines.
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        arr = np.frombuffer(mm, dtype=np.uint8)
        cr = np.zeros(len(e), dtype=bool)
        nonempty = e > s
        cr[nonempty] = arr[e[nonempty] - 1] == 13
        del arr
    e = e - cr
    keep = e > s
    return np.stack([s[keep], e[keep]], axis=1)


class _File:
    def __init__(self, path: str, use_cache: bool) -> None:
        self.path = path
        index = cached_index(path, "jsonl-lines", lambda: _line_index(path), use_cache=use_cache)
        flat = np.ascontiguousarray(index.reshape(-1, 2), dtype=np.int64)
        self.spans = array.array("q", flat.tobytes())
        self.num_records = len(self.spans) // 2
        if os.path.getsize(path):
            with open(path, "rb") as f:
                self.mm: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        else:
            self.mm = None

    def line(self, i: int) -> bytes:
        assert self.mm is not None
        return self.mm[self.spans[2 * i] : self.spans[2 * i + 1]]

    def line_number(self, i: int) -> int:
        assert self.mm is not None
        return self.mm[: self.spans[2 * i]].count(b"\n") + 1


class JsonlDataSource:
    """Records of JSON Lines files, one per non-blank line, decoded to Python objects.

    Random access goes through a line-offset index, built once per file and cached
    beside it (`.NAME.jsonl-lines.chute-index`; rebuilt when the file changes; pass
    `cache_index=False` to keep it in memory only). Decoding uses orjson when it is
    installed. `decode=False` returns each line as bytes. Picklable, thread-safe.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write('{"a": 1}\\n\\n{"a": 2}\\n')
    >>> src = JsonlDataSource(path)
    >>> len(src), src[1], JsonlDataSource(path, decode=False)[0]
    (2, {'a': 2}, b'{"a": 1}')
    """

    def __init__(self, paths: PathsArg, *, decode: bool = True, cache_index: bool = True) -> None:
        self._paths = expand_paths(paths, "JsonlDataSource")
        self._decode = decode
        self._cache = cache_index
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._files: list[_File] | None = None
        self._concat = Concat([])

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self._paths, "decode": self._decode, "cache": self._cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._paths, self._decode, self._cache = state["paths"], state["decode"], state["cache"]
        self._init_runtime()

    def _open(self) -> list[_File]:
        with self._lock:
            if self._files is None:
                files = [_File(p, self._cache) for p in self._paths]
                self._concat = Concat([f.num_records for f in files])
                self._files = files
            return self._files

    def __len__(self) -> int:
        self._files or self._open()
        return len(self._concat)

    def _read(self, index: int) -> Any:
        files = self._files or self._open()
        k, i = self._concat.locate(index, self)
        f = files[k]
        line = f.line(i)
        if not self._decode:
            return line
        try:
            return _loads(line)
        except ValueError as e:
            raise DataError(
                f"{f.path}: record {i} (line {f.line_number(i)}) is not valid JSON ({e}): "
                f"{line[:80]!r}; fix or drop that line, or read raw lines with decode=False"
            ) from None

    def __getitem__(self, index: int) -> Any:
        return self._read(index)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        read = self._read
        return [read(i) for i in indices]

    def __repr__(self) -> str:
        p = self._paths
        shown = repr(p[0]) if len(p) == 1 else f"<{len(p)} files: {p[0]!r}, ...>"
        return f"JsonlDataSource({shown}, decode={self._decode})"
