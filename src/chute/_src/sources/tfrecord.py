"""`TFRecordDataSource`: random access to TFRecord files through a one-scan offset index."""

from __future__ import annotations

import array
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.errors import DataError
from chute._src.records.format import crc32c
from chute._src.sources._concat import Concat
from chute._src.sources._index_cache import cached_index
from chute._src.sources._paths import PathsArg, expand_paths

__all__ = ["TFRecordDataSource", "masked_crc32c"]

_HEAD = struct.Struct("<QI")
_FIX = "the file is truncated or corrupt; re-create it or restore a good copy"


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC32C of `data`.

    >>> hex(masked_crc32c(b""))
    '0xa282ead8'
    """
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _scan(path: str, mm: mmap.mmap | None) -> np.ndarray:
    """(data offset, length) of every record, checking each length's CRC."""
    out: list[int] = []
    size = len(mm) if mm is not None else 0
    pos = 0
    n = 0
    while pos < size:
        assert mm is not None
        if pos + 12 > size:
            raise DataError(f"{path}: record {n}: the file ends inside a record header; {_FIX}")
        length, length_crc = _HEAD.unpack_from(mm, pos)
        if masked_crc32c(mm[pos : pos + 8]) != length_crc:
            raise DataError(f"{path}: record {n}: its length fails its CRC32C check; {_FIX}")
        if pos + 16 + length > size:
            raise DataError(
                f"{path}: record {n}: {length} bytes of data run past the end of the file; {_FIX}"
            )
        out += (pos + 12, length)
        pos += 16 + length
        n += 1
    return np.array(out, dtype=np.int64).reshape(-1, 2)


class _File:
    def __init__(self, path: str, use_cache: bool) -> None:
        self.path = path
        self.mm: mmap.mmap | None = None
        if os.path.getsize(path):
            with open(path, "rb") as f:
                self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        index = cached_index(path, "tfrecord", lambda: _scan(path, self.mm), use_cache=use_cache)
        flat = np.ascontiguousarray(index.reshape(-1, 2), dtype=np.int64)
        self.spans = array.array("q", flat.tobytes())
        self.num_records = len(flat)


class TFRecordDataSource:
    """Records of TFRecord files, as bytes, with random access.

    One scan of each file builds an offset index (checking every length CRC), cached
    beside the file like `JsonlDataSource`'s. Each read checks the record's data CRC
    unless `verify_checksums=False`. Parsing `tf.train.Example` is left to the caller.
    Picklable, thread-safe.
    """

    def __init__(
        self, paths: PathsArg, *, verify_checksums: bool = True, cache_index: bool = True
    ) -> None:
        self._paths = expand_paths(paths, "TFRecordDataSource")
        self._verify = verify_checksums
        self._cache = cache_index
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._files: list[_File] | None = None
        self._concat = Concat([])

    def __getstate__(self) -> dict[str, Any]:
        return {"paths": self._paths, "verify": self._verify, "cache": self._cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._paths, self._verify, self._cache = state["paths"], state["verify"], state["cache"]
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

    def __getitem__(self, index: int) -> bytes:
        files = self._files or self._open()
        k, i = self._concat.locate(index, self)
        f = files[k]
        mm = f.mm
        assert mm is not None
        start = f.spans[2 * i]
        end = start + f.spans[2 * i + 1]
        data = mm[start:end]
        if self._verify:
            (stored,) = struct.unpack_from("<I", mm, end)
            if masked_crc32c(data) != stored:
                raise DataError(f"{f.path}: record {i}: its data fails its CRC32C check; {_FIX}")
        return data

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        return [self[i] for i in indices]

    def __repr__(self) -> str:
        p = self._paths
        shown = repr(p[0]) if len(p) == 1 else f"<{len(p)} files: {p[0]!r}, ...>"
        return f"TFRecordDataSource({shown}, verify_checksums={self._verify})"
