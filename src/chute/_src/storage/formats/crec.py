"""`RecordFileDataSource`: random access to `.crec` files, one or many shards."""

from __future__ import annotations

import bisect
import functools
import glob
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from chute._src.core.errors import DataError
from chute._src.storage.formats._paths import PathsArg, expand_paths, reads_in_flight_for
from chute._src.storage.records.checksum import crc32c, read_checked
from chute._src.storage.records.manifest import (
    MANIFEST_NAME,
    ShardEntry,
    read_manifest,
    read_remote_manifest,
)
from chute._src.storage.records.reader import CrecFile
from chute._src.storage.remote.calls import call
from chute._src.storage.remote.file import open_concurrently, read_many
from chute._src.storage.remote.urls import StorageOptions, filesystem, is_url

__all__ = ["RecordFileDataSource"]

_lseek = os.lseek
_SEEK_END = os.SEEK_END


def _resolve(paths: PathsArg, options: StorageOptions) -> list[tuple[str, ShardEntry | None]]:
    out: list[tuple[str, ShardEntry | None]] = []
    single = isinstance(paths, str | os.PathLike) or hasattr(paths, "read")
    items: list[Any] = [paths] if single else list(cast(Sequence[Any], paths))
    for item in items:
        name = str(item).rstrip("/").rsplit("/", 1)[-1]
        looks_dir = name == MANIFEST_NAME or "." not in name
        if isinstance(item, str) and is_url(item) and looks_dir and not glob.has_magic(item):
            # A dataset directory (a prefix holding manifest.json) or its manifest.
            url = item.rstrip("/")
            manifest = url if url.endswith("/" + MANIFEST_NAME) else f"{url}/{MANIFEST_NAME}"
            fs, fspath = filesystem(manifest, options)
            exists = functools.partial(fs.exists, fspath)
            if url == manifest or call(manifest, "look for it", exists):
                out.extend((s, e) for s, e in read_remote_manifest(manifest, options))
                continue
        out.extend(_resolve_local(item, options))
    return out


def _resolve_local(paths: PathsArg, options: StorageOptions) -> list[tuple[str, ShardEntry | None]]:
    out: list[tuple[str, ShardEntry | None]] = []
    for p in expand_paths(paths, "RecordFileDataSource", options):
        if is_url(p):
            out.append((p, None))
            continue
        path = Path(p)
        if path.is_dir():
            path = path / MANIFEST_NAME
        if path.name == MANIFEST_NAME:
            out.extend((str(s), e) for s, e in read_manifest(path))
        else:
            out.append((p, None))
    return out


class RecordFileDataSource:
    """Records of `.crec` files, by global index across all files, as bytes.

    `paths` is a file, a glob pattern, a directory holding a `manifest.json` (as
    written by `chute.records.ShardedRecordWriter` or `chute convert`), the manifest
    itself, or a list of these; files are concatenated in order. Files are memory
    mapped on first use, so the source is cheap to create and to pickle: a copy in
    another process reopens the files itself. Each read first makes sure that no file
    has shrunk since it was opened (a flag test while chute holds a lease on the file,
    else a size check per read or block of reads), so a file truncated in place raises
    `chute.DataError` rather than crashing the process with SIGBUS. Every read checks the record's CRC32C
    unless `verify_checksums=False`; corruption raises `chute.DataError` naming the
    file and the record. Thread-safe.

    >>> import tempfile, os
    >>> from chute.records import RecordWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "data.crec")
    >>> with RecordWriter(path) as w:
    ...     for word in [b"alpha", b"beta", b"gamma"]:
    ...         _ = w.write(word)
    >>> src = RecordFileDataSource(path)
    >>> len(src), src[2], src.__getitems__([1, 0])
    (3, b'gamma', [b'beta', b'alpha'])
    >>> buf = bytearray(64)
    >>> ends = src.read_into([2, 0], buf)
    >>> bytes(buf[ends[0] : ends[1]]), bytes(buf[ends[1] : ends[2]])
    (b'gamma', b'alpha')
    """

    def __init__(
        self,
        paths: PathsArg,
        *,
        verify_checksums: bool = True,
        storage_options: StorageOptions = None,
    ) -> None:
        self._options = dict(storage_options or {})
        self._entries = _resolve(paths, self._options)
        if not self._entries:
            raise DataError(f"RecordFileDataSource({paths!r}): the manifest lists no shards")
        self._verify = verify_checksums
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._files: list[CrecFile] | None = None
        self._single: CrecFile | None = None
        self._fast: tuple[Any, ...] | None = None
        self._starts: list[int] = []
        self._len = 0
        self._remote = False

    @property
    def reads_in_flight(self) -> int:
        """Reads a pipeline should keep in flight from the start (`_src/core/in_flight.py`):
        many for remote files (each read waits a round trip), none for local ones."""
        return reads_in_flight_for(e[0] for e in self._entries)

    def __getstate__(self) -> dict[str, Any]:
        return {"entries": self._entries, "verify": self._verify, "options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._entries = state["entries"]
        self._verify = state["verify"]
        self._options = state["options"]
        self._init_runtime()

    def _open(self) -> list[CrecFile]:
        with self._lock:
            if self._files is not None:
                return self._files
            files = open_concurrently(
                lambda k: CrecFile(
                    self._entries[k][0], verify=self._verify, storage_options=self._options
                ),
                [p for p, _ in self._entries],
            )
            base = 0
            try:
                for f, (_, entry) in zip(files, self._entries):
                    f.base = base
                    if entry is not None:
                        self._check_entry(f, entry)
                    base += f.num_records
            except BaseException:
                for f in files:
                    f.close()
                raise
            self._starts = [f.base for f in files]
            self._len = base
            self._single = files[0] if len(files) == 1 else None
            self._remote = any(f.remote for f in files)
            if self._single is not None and not self._remote:
                f = self._single
                all_raw = not np.frombuffer(f.codecs, dtype=np.uint8).any()
                self._fast = (
                    f.num_records,
                    f.offsets,
                    f.lengths,
                    f.crcs,
                    None if all_raw else f.codecs,  # no per-read codec lookup if all raw
                    f.mm,
                    self._verify,
                    read_checked if self._verify else None,
                    f.guard,
                    f.guard.fd,
                    f.size,
                )
            self._files = files
            return files

    @staticmethod
    def _check_entry(f: CrecFile, entry: ShardEntry) -> None:
        found = (f.num_records, f.size, f.trailer_crc())
        expected = (entry.num_records, entry.size, entry.trailer_crc32c)
        if found != expected:
            raise DataError(
                f"{f.path}: the shard does not match its manifest entry (records, size, "
                f"trailer CRC32C: file has {found}, manifest says {expected}); a shard was "
                "replaced or partly copied; copy the whole dataset directory again"
            )

    @property
    def paths(self) -> list[str]:
        """The files read, in order."""
        return [p for p, _ in self._entries]

    @property
    def metadata(self) -> dict[str, Any]:
        """The JSON metadata stored by the writer of the first file."""
        return dict(self._open()[0].metadata)

    def __len__(self) -> int:
        if self._files is None:
            self._open()
        return self._len

    def record_location(self, index: int) -> dict[str, Any]:
        """Where record `index` is stored: its file, the file's number (shard) and the
        record's number in it (what `chute.experimental.provenance` shows)."""
        _, i = self._locate(index)
        k = bisect.bisect_right(self._starts, index) - 1
        return {"file": self.paths[k], "shard": k, "record": i}

    def _locate(self, index: int) -> tuple[CrecFile, int]:
        files = self._files or self._open()
        n = self._len
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} is out of range for {self!r} of length {n}")
        k = bisect.bisect_right(self._starts, index) - 1
        f = files[k]
        return f, index - f.base

    def __getitem__(self, index: int) -> bytes:
        fast = self._fast
        if fast is not None:
            # One file: the common case, inlined. Anything unusual (a compressed record,
            # a bad checksum, an index out of range) goes through CrecFile.read. The file
            # must still be as long as when opened: reading a truncated map is a SIGBUS.
            n, offsets, lengths, crcs, codecs, mm, verify, checked, guard, fd, size = fast
            # While leased, the kernel tells us before the file can shrink: a flag test.
            if (
                0 <= index < n
                and (guard.leased or _lseek(fd, 0, 2) >= size)  # SEEK_END
                and (codecs is None or not codecs[index])
            ):
                o = offsets[index]
                if checked is not None:  # the native extension slices and checks in one call
                    data = checked(mm, o, lengths[index], crcs[index])
                else:
                    data = mm[o : o + lengths[index]]
                    if verify and crc32c(data) != crcs[index]:
                        data = None
                if data is not None:  # else a bad checksum: CrecFile.read raises
                    return data
        f, i = self._locate(index)
        return f.read(i)

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        if self._files is None:
            self._open()
        fast = self._fast
        if fast is None:
            return self._getitems_files(indices)
        n, offsets, lengths, crcs, codecs, mm, verify, checked, guard, fd, size = fast
        out: list[bytes] = []
        append = out.append
        unchecked = True  # the size check, once per block, once the file is not leased
        for i in indices:
            if unchecked and not guard.leased:  # a flag test per record while leased
                if _lseek(fd, 0, _SEEK_END) < size:
                    f, j = self._locate(int(i))
                    raise f.shrunk_error(j)
                unchecked = False
            if 0 <= i < n and (codecs is None or not codecs[i]):
                o = offsets[i]
                if checked is not None:
                    data = checked(mm, o, lengths[i], crcs[i])
                else:
                    data = mm[o : o + lengths[i]]
                    if verify and crc32c(data) != crcs[i]:
                        data = None
                if data is not None:
                    append(data)
                    continue
            append(self[i])
        return out

    def _getitems_files(self, indices: Sequence[int]) -> list[bytes]:
        """`__getitems__` over several files: one size check per file per block."""
        if self._remote:
            return self._getitems_remote(indices)
        checked: set[int] = set()
        out: list[bytes] = []
        for g in indices:
            f, i = self._locate(g)
            f.guard.check_once(checked, i)
            out.append(f.read_unguarded(i))
        return out

    def _getitems_remote(self, indices: Sequence[int]) -> list[bytes]:
        """A block of reads of remote files: every payload fetched at once (`read_many`:
        one round of concurrent range requests for what the block cache lacks), then each
        checked and decoded as a local read would be."""
        locate = self._locate
        located = [locate(int(g)) for g in indices]
        items: list[tuple[Any, int, int]] = []
        for f, i in located:
            if f.remote:
                o = f.offsets[i]
                items.append((f.mm, o, o + f.lengths[i]))
        payloads = iter(read_many(items))
        out: list[bytes] = []
        append = out.append
        for f, i in located:
            if not f.remote:
                append(f.read_unguarded(i))
                continue
            data = next(payloads)
            if (f.verify and crc32c(data) != f.crcs[i]) or f.codecs[i]:
                data = f.decode(i, data)  # raises the checksum error, or decompresses
            append(data)
        return out

    def _check_sizes(self, located: list[tuple[CrecFile, int]]) -> None:
        checked: set[int] = set()
        for f, i in located:
            f.guard.check_once(checked, i)

    def view(self, index: int) -> memoryview:
        """Record `index` without a copy: a read-only view into the mapped file.

        Compressed records are decompressed into a new buffer. The view stays valid
        as long as the source is alive, and as long as the file is not truncated: the
        size is checked when the view is made, but touching a view of a file that has
        since shrunk faults (SIGBUS). Copy it (`bytes(view)`) to keep it safely.
        """
        f, i = self._locate(index)
        self._check_sizes([(f, i)])
        if f.codecs[i]:
            return memoryview(f.read(i))
        o = f.offsets[i]
        v = memoryview(f.view[o : o + f.lengths[i]])  # a copy for a remote file
        if self._verify:
            c = crc32c(v)
            if c != f.crcs[i]:
                raise f.checksum_error(i, f.crcs[i], c)
        return v

    def record_sizes(self, indices: Sequence[int]) -> np.ndarray:
        """The decoded size in bytes of each record of `indices` (int64)."""
        located = [self._locate(int(g)) for g in indices]
        self._check_sizes(located)  # the index is in the map too
        out = np.empty(len(indices), dtype=np.int64)
        for k, (f, i) in enumerate(located):
            out[k] = f.raw_lengths[i]
        return out

    def read_into(self, indices: Sequence[int], out: Any) -> np.ndarray:
        """Copies the records of `indices` back to back into the writable buffer `out`.

        Returns `ends`, int64 of length `len(indices) + 1` with `ends[0] == 0`: record k
        is `out[ends[k]:ends[k + 1]]`. Checksums are verified on the copy. `out` is any
        writable C-contiguous buffer (bytearray, numpy array, ...) of at least
        `record_sizes(indices).sum()` bytes; reuse it across calls.
        """
        dst = memoryview(out)
        if dst.readonly:
            raise ValueError("read_into needs a writable buffer; got a read-only one")
        dst = dst.cast("B") if dst.format != "B" or dst.ndim != 1 else dst
        located = [self._locate(int(g)) for g in indices]
        self._check_sizes(located)
        total = sum(f.raw_lengths[i] for f, i in located)
        if total > dst.nbytes:
            raise ValueError(
                f"read_into: the buffer holds {dst.nbytes} bytes but the {len(located)} "
                f"records need {total}; allocate at least record_sizes(indices).sum() bytes"
            )
        ends = np.zeros(len(located) + 1, dtype=np.int64)
        pos = 0
        verify = self._verify
        checked = {id(f.guard) for f, _ in located if not f.guard.leased}  # by _check_sizes
        for k, (f, i) in enumerate(located):
            f.guard.check_once(checked, i)  # a guard whose lease broke meanwhile
            if f.codecs[i]:
                data = f.read_unguarded(i)
                end = pos + len(data)
                dst[pos:end] = data
            else:
                o = f.offsets[i]
                end = pos + f.lengths[i]
                dst[pos:end] = f.view[o : o + f.lengths[i]]
                if verify:
                    c = crc32c(dst[pos:end])
                    if c != f.crcs[i]:
                        raise f.checksum_error(i, f.crcs[i], c)
            pos = end
            ends[k + 1] = pos
        return ends

    def close(self) -> None:
        """Unmaps the files; the source reopens them if used again."""
        with self._lock:
            for f in self._files or []:
                f.close()
            self._files = None
            self._single = None
            self._fast = None

    def __repr__(self) -> str:
        paths = self.paths
        shown = repr(paths[0]) if len(paths) == 1 else f"<{len(paths)} files: {paths[0]!r}, ...>"
        return f"RecordFileDataSource({shown}, verify_checksums={self._verify})"
