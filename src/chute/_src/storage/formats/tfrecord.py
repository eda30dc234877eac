"""`TFRecordDataSource`: random access to TFRecord files through a one-scan offset index."""

from __future__ import annotations

import array
import struct
from typing import Any

import numpy as np

from chute._src.core.errors import DataError
from chute._src.storage.formats._concat import MultiFileSource
from chute._src.storage.formats._index_cache import cached_index, cached_remote_index
from chute._src.storage.formats._open import open_data
from chute._src.storage.formats._paths import PathsArg
from chute._src.storage.records.checksum import crc32c
from chute._src.storage.remote.file import RemoteFile
from chute._src.storage.remote.urls import StorageOptions, display_url

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


def _scan(path: str, mm: Any) -> np.ndarray:
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


def _scan_stream(g: RemoteFile) -> np.ndarray:
    """`_scan` of a remote object, read once from start to end."""
    with g.reader() as f:
        data = f.read()
    if len(data) != g.size:
        raise DataError(f"{g.url}: read {len(data)} of its {g.size} bytes; {_FIX}")
    return _scan(g.url, data)


class _File:
    def __init__(self, path: str, use_cache: bool, storage: StorageOptions) -> None:
        self.path = display_url(path)  # in messages: no password
        self.guard = open_data(path, "a TFRecord file", storage)
        self.fd, self.size = self.guard.fd, self.guard.size
        self.remote = isinstance(self.guard, RemoteFile)
        self.mm: Any = None
        if self.size:
            self.mm = self.guard.mapping()
        if isinstance(self.guard, RemoteFile):  # indexed by one sequential read, cached
            g = self.guard
            index = cached_remote_index(
                path, g.identity, "tfrecord", lambda: _scan_stream(g), use_cache=use_cache
            )
        else:
            index = cached_index(
                path, "tfrecord", lambda: _scan(path, self.mm), use_cache=use_cache
            )
        flat = np.ascontiguousarray(index.reshape(-1, 2), dtype=np.int64)
        self.spans = array.array("q", flat.tobytes())
        self.num_records = len(flat)


class TFRecordDataSource(MultiFileSource["_File"]):
    """Records of TFRecord files, as bytes, with random access.

    One scan of each file builds an offset index (checking every length CRC), cached
    in the per-user cache directory like `JsonlDataSource`'s. Each read checks the record's data CRC
    unless `verify_checksums=False`. Parsing `tf.train.Example` is left to the caller.
    Each read first makes sure that the file has not shrunk since it was opened (a flag
    test while chute holds a lease on it, else a size check per read or block): a file
    truncated in place raises `chute.DataError` instead of a SIGBUS.
    Picklable, thread-safe.
    """

    _options = ("verify", "cache")
    _verify: bool
    _cache: bool

    def __init__(
        self,
        paths: PathsArg,
        *,
        verify_checksums: bool = True,
        cache_index: bool = True,
        storage_options: StorageOptions = None,
    ) -> None:
        super().__init__(
            paths, verify=verify_checksums, cache=cache_index, storage_options=storage_options
        )

    def _open_file(self, path: str) -> _File:
        return _File(path, self._cache, self._storage)

    def _span(self, f: _File, i: int) -> tuple[int, int]:
        start = f.spans[2 * i]
        return start, start + f.spans[2 * i + 1] + 4

    def _record(self, f: _File, i: int) -> bytes:
        mm = f.mm
        assert mm is not None
        start = f.spans[2 * i]
        end = start + f.spans[2 * i + 1]
        if f.remote:  # one range read: the data and its CRC
            both = mm[start : end + 4]
            data, tail = both[:-4], both[-4:]
        else:
            data = mm[start:end]
        if self._verify:
            if len(data) != end - start or end + 4 > len(mm):
                raise DataError(f"{f.path}: record {i}: it runs past the end of the file; {_FIX}")
            if f.remote:
                (stored,) = struct.unpack("<I", tail)
            else:
                (stored,) = struct.unpack_from("<I", mm, end)
            if masked_crc32c(data) != stored:
                err = DataError(f"{f.path}: record {i}: its data fails its CRC32C check; {_FIX}")
                raise f.guard.explain(err)
        return data

    def __repr__(self) -> str:
        return f"TFRecordDataSource({self._shown_paths()}, verify_checksums={self._verify})"
