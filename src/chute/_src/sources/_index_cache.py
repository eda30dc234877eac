"""An offset index built once per file and cached beside it (`.NAME.KIND.chute-index`).

The cache stores the file's size and modification time; a file that changed gets a new
index. A directory that cannot be written to just means no cache. No pickle: a fixed
header and a raw little-endian uint64 array.
"""

from __future__ import annotations

import contextlib
import os
import struct
import uuid
from collections.abc import Callable

import crc32c
import numpy as np

__all__ = ["cached_index", "cache_path"]

_MAGIC = b"CHUTEIDX"
# magic, version, kind (16 bytes), file size, file mtime_ns, element count, crc32c.
_HEADER = struct.Struct("<8sI16sQQQI")


def cache_path(path: str, kind: str) -> str:
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{kind}.chute-index")


def _load(cpath: str, kind: bytes, size: int, mtime: int) -> np.ndarray | None:
    try:
        with open(cpath, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if len(raw) < _HEADER.size:
        return None
    magic, version, k, fsize, fmtime, count, crc = _HEADER.unpack_from(raw)
    body = raw[_HEADER.size :]
    ok = (
        magic == _MAGIC
        and version == 1
        and k.rstrip(b"\0") == kind
        and (fsize, fmtime) == (size, mtime)
        and len(body) == count * 8
        and crc32c.crc32c(body) == crc
    )
    if not ok:
        return None
    return np.frombuffer(body, dtype="<u8").astype(np.int64)


def _store(cpath: str, kind: bytes, size: int, mtime: int, index: np.ndarray) -> None:
    body = np.ascontiguousarray(index, dtype="<u8").tobytes()
    header = _HEADER.pack(_MAGIC, 1, kind, size, mtime, len(body) // 8, crc32c.crc32c(body))
    tmp = f"{cpath}.{uuid.uuid4().hex[:8]}.partial"
    try:
        with open(tmp, "wb") as f:
            f.write(header + body)
        os.replace(tmp, cpath)
    except OSError:  # read-only directory: go on without a cache
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def cached_index(
    path: str, kind: str, build: Callable[[], np.ndarray], *, use_cache: bool = True
) -> np.ndarray:
    """Returns the int64 array `build()` makes for `path`, from the cache when it is fresh."""
    st = os.stat(path)
    key = kind.encode()[:16]
    cpath = cache_path(path, kind)
    if use_cache:
        found = _load(cpath, key, st.st_size, st.st_mtime_ns)
        if found is not None:
            return found
    index = np.asarray(build(), dtype=np.int64)
    if use_cache:
        _store(cpath, key, st.st_size, st.st_mtime_ns, index.ravel())
    return index
