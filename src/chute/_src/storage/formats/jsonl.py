"""`JsonlDataSource`: random access to JSON Lines files through a line-offset index."""

from __future__ import annotations

import array
import mmap
from typing import Any

import numpy as np

from chute._src.core.errors import DataError
from chute._src.storage.formats._concat import MultiFileSource
from chute._src.storage.formats._file_guard import open_error
from chute._src.storage.formats._index_cache import cached_index, cached_remote_index
from chute._src.storage.formats._open import open_data
from chute._src.storage.formats._paths import PathsArg
from chute._src.storage.remote.file import RemoteFile
from chute._src.storage.remote.urls import StorageOptions, display_url

__all__ = ["JsonlDataSource"]

try:
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - orjson is in the test extra
    import json

    _loads = json.loads

_CHUNK = 16 << 20


def _line_index_stream(f: Any) -> np.ndarray:
    """`_line_index` of a file read once from start to end (a remote object)."""
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    crs: list[np.ndarray] = []
    pos = 0
    line_start = 0
    prev = 0  # the byte before this chunk
    while chunk := f.read(_CHUNK):
        arr = np.frombuffer(chunk, dtype=np.uint8)
        nl = np.flatnonzero(arr == 10)
        if len(nl):
            before = np.where(nl > 0, arr[np.maximum(nl - 1, 0)], prev)
            starts.append(np.concatenate([[line_start], nl[:-1] + pos + 1]))
            ends.append(nl + pos)
            crs.append(before == 13)
            line_start = int(nl[-1]) + pos + 1
        prev = int(arr[-1])
        pos += len(chunk)
    if pos > line_start:
        starts.append(np.array([line_start]))
        ends.append(np.array([pos]))
        crs.append(np.array([prev == 13]))
    if not starts:
        return np.zeros((0, 2), dtype=np.int64)
    s = np.concatenate(starts).astype(np.int64)
    e = np.concatenate(ends).astype(np.int64)
    e = e - (np.concatenate(crs) & (e > s))
    keep = e > s
    return np.stack([s[keep], e[keep]], axis=1)


def _stream(g: RemoteFile) -> np.ndarray:
    with g.reader(_CHUNK) as f:
        return _line_index_stream(f)


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
    def __init__(self, path: str, use_cache: bool, storage: StorageOptions) -> None:
        self.path = display_url(path)  # in messages: no password
        self.guard = open_data(path, "a JSON Lines file", storage)
        self.fd, self.size = self.guard.fd, self.guard.size
        if isinstance(self.guard, RemoteFile):  # indexed by one sequential read, cached
            g = self.guard
            index = cached_remote_index(
                path, g.identity, "jsonl-lines", lambda: _stream(g), use_cache=use_cache
            )
        else:
            try:
                index = cached_index(
                    path, "jsonl-lines", lambda: _line_index(path), use_cache=use_cache
                )
            except OSError as e:
                raise open_error(path, e, "a JSON Lines file") from e
        flat = np.ascontiguousarray(index.reshape(-1, 2), dtype=np.int64)
        self.spans = array.array("q", flat.tobytes())
        self.num_records = len(self.spans) // 2
        self.mm: Any = None
        if self.size:
            self.mm = self.guard.mapping()

    def line(self, i: int) -> bytes:
        assert self.mm is not None
        return self.mm[self.spans[2 * i] : self.spans[2 * i + 1]]

    def line_number(self, i: int) -> int:
        assert self.mm is not None
        return self.mm[: self.spans[2 * i]].count(b"\n") + 1


class JsonlDataSource(MultiFileSource["_File"]):
    """Records of JSON Lines files, one per non-blank line, decoded to Python objects.

    Random access goes through a line-offset index, built once per file and cached in
    the per-user cache directory (`~/.cache/chute`; nothing is written beside the data
    unless `CHUTE_INDEX_CACHE=beside`; rebuilt when the file changes; pass
    `cache_index=False` to keep it in memory only). Decoding uses orjson when it is
    installed. `decode=False` returns each line as bytes. Each read first makes sure that
    the file has not shrunk since it was opened (a flag test while chute holds a lease on
    it, else a size check per read or block): a file truncated in place raises
    `chute.DataError` instead of a SIGBUS. Picklable, thread-safe.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "d.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write('{"a": 1}\\n\\n{"a": 2}\\n')
    >>> src = JsonlDataSource(path)
    >>> len(src), src[1], JsonlDataSource(path, decode=False)[0]
    (2, {'a': 2}, b'{"a": 1}')
    """

    _options = ("decode", "cache")
    _decode: bool
    _cache: bool

    def __init__(
        self,
        paths: PathsArg,
        *,
        decode: bool = True,
        cache_index: bool = True,
        storage_options: StorageOptions = None,
    ) -> None:
        super().__init__(paths, decode=decode, cache=cache_index, storage_options=storage_options)

    def _open_file(self, path: str) -> _File:
        return _File(path, self._cache, self._storage)

    def _span(self, f: _File, i: int) -> tuple[int, int]:
        return f.spans[2 * i], f.spans[2 * i + 1]

    def _record(self, f: _File, i: int) -> Any:
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

    def __repr__(self) -> str:
        return f"JsonlDataSource({self._shown_paths()}, decode={self._decode})"
