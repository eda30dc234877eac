"""`ArrayRecordDataSource`: fast random access to ArrayRecord files (the `array-record` extra)."""

from __future__ import annotations

import array
import mmap
import os
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core.errors import DataError
from chute._src.storage.formats._concat import Concat
from chute._src.storage.formats._file_guard import FileGuard
from chute._src.storage.formats._index_cache import cached_index, cached_remote_index
from chute._src.storage.formats._index_checks import riegeli_spans_agree
from chute._src.storage.formats._paths import PathsArg, reads_in_flight_for
from chute._src.storage.formats._riegeli import (
    decode_record,
    decode_record_from,
    record_extent,
    scan_single_record_chunks,
)
from chute._src.storage.remote.file import RemoteFile, open_concurrently, read_many
from chute._src.storage.remote.urls import StorageOptions, is_url

__all__ = ["ArrayRecordDataSource"]

# Single reads: no readahead, no thread pool and a small buffer make seek+read a few
# microseconds; per-item `read([i])` costs hundreds (it sets up a parallel read).
_SINGLE_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"
_SINGLE_BUFFER = 1024
# Large batches go through the reader's own parallel `read(indices)`.
_BATCH_OPTIONS = "readahead_buffer_size:0"
_BATCH_BUFFER = 32768
_lseek = os.lseek
_SEEK_END = os.SEEK_END
# A file's direct-read index: 4 ints per record, the map, and the open file behind it.
_Direct = tuple["array.array[int]", Any, FileGuard | RemoteFile]


def _module() -> Any:
    try:
        from array_record.python import array_record_module
    except ImportError as e:
        raise ImportError(
            "ArrayRecordDataSource needs array-record: pip install 'chute[arrayrecord]'"
        ) from e
    return array_record_module


def _remote_spans(f: RemoteFile, zstd: Any) -> np.ndarray:
    """The direct-read index of a remote ArrayRecord file: built once from a temporary
    local copy (the C++ reader counts the records and checks Riegeli's hashes while the
    CRC32C of every record is taken), then kept in the per-user cache."""
    fix = (
        "chute reads remote ArrayRecord files written with group_size:1 (zstd or "
        "uncompressed), one record per chunk; rewrite it so (`chute convert IN "
        "OUT.array_record`), or copy it to a local disk"
    )
    fd, tmp = tempfile.mkstemp(prefix=".chute-arrayrecord-", suffix=".array_record")
    os.close(fd)
    try:
        f.copy_to(tmp)
        try:
            reader = _module().ArrayRecordReader(tmp, _SINGLE_OPTIONS)
            ok = reader.ok()
        except (RuntimeError, ValueError, OSError) as e:
            raise DataError(
                f"{f.url}: cannot open as an ArrayRecord file ({e}); re-create it or "
                "restore a good copy"
            ) from None
        if not ok:
            raise DataError(f"{f.url}: not a readable ArrayRecord file; re-create it")
        n = int(reader.num_records())
        group = _group_size(reader.writer_options_string() or "")
        spans = np.zeros(0, dtype=np.int64)
        if group == 1 and n and zstd is not None:
            with open(tmp, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                spans = scan_single_record_chunks(mm, reader, n)
        reader.close()
        if n and len(spans) != 4 * n:
            raise DataError(f"{f.url}: written with group_size:{group}; {fix}")
        return spans
    finally:
        os.unlink(tmp)


def _group_size(options: str) -> int:
    m = re.search(r"group_size:(\d+)", options)
    return int(m.group(1)) if m else 1


class ArrayRecordDataSource:
    """Records of ArrayRecord files, as bytes, by global index across files.

    `paths` is a file, a glob, a list of them, or a dataset directory whose
    `manifest.json` lists ArrayRecord shards (written by `chute.beam` or
    `chute.records.write_manifest`); each listed shard is checked against its entry.

    A drop-in for `grain.sources.ArrayRecordDataSource(paths, reader_options)`, built for
    random access: each thread keeps its own reader per file and reads one record with
    `seek` + `read` (microseconds, where `read([i])` costs hundreds), a batch of at
    least `batch_threshold` indices goes through the reader's parallel `read(indices)`,
    and files written with `group_size` > 1 are read a whole chunk at a time into a small
    cache of decoded chunks (`chunk_cache_size` chunks).

    With `direct=True` (the default), files written with `group_size:1` (the layout
    random access wants) are read straight from a memory map: one pass over the file,
    cached in the per-user cache directory like `JsonlDataSource`'s index, locates every
    record's chunk and records the CRC32C of every record as read (hash-checked) by the
    C++ reader; a read is then a slice, a zstd decompression and a CRC32C check, about
    twice as fast as the C++ reader's seek+read; each first checks that the file has not
    shrunk since it was mapped (a truncated map would SIGBUS), raising `chute.DataError`
    if it has.
    `direct=False` reads everything through the C++ reader.
    Picklable, thread-safe.
    """

    def __init__(
        self,
        paths: PathsArg,
        reader_options: dict[str, str] | None = None,
        *,
        batch_threshold: int = 256,
        chunk_cache_size: int = 16,
        direct: bool = True,
        storage_options: StorageOptions = None,
    ) -> None:
        _module()
        from chute._src.storage.records.shard_files import dataset_paths

        self._storage = dict(storage_options or {})
        self._paths = dataset_paths(paths, "arrayrecord", "ArrayRecordDataSource", self._storage)
        if not direct and any(is_url(p) for p in self._paths):
            raise ValueError(
                "ArrayRecordDataSource(direct=False) reads through the C++ reader, which "
                "needs local files; remote files (URLs) are read directly: drop direct=False"
            )
        self._extra = ",".join(f"{k}:{v}" for k, v in (reader_options or {}).items())
        self._batch_threshold = batch_threshold
        self._chunk_cache_size = chunk_cache_size
        self._direct = direct
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._concat: Concat | None = None
        self._fast_len = 0
        self._fast_direct: tuple[int, array.array[int], Any, FileGuard | RemoteFile] | None = None
        # Per file: not scanned yet (missing key), no direct path (None), or its index.
        self._spans: dict[int, _Direct | None] = {}
        self._groups: list[int] = []
        self._chunks: OrderedDict[tuple[int, int], list[bytes]] = OrderedDict()
        self._remote = any(is_url(p) for p in self._paths)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "paths": self._paths,
            "extra": self._extra,
            "batch_threshold": self._batch_threshold,
            "chunk_cache_size": self._chunk_cache_size,
            "direct": self._direct,
            "storage": self._storage,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._paths = state["paths"]
        self._extra = state["extra"]
        self._batch_threshold = state["batch_threshold"]
        self._chunk_cache_size = state["chunk_cache_size"]
        self._direct = state["direct"]
        self._storage = state["storage"]
        self._init_runtime()

    def _options(self, base: str) -> str:
        return f"{base},{self._extra}" if self._extra else base

    def _new_reader(self, k: int, batch: bool) -> Any:
        path = self._paths[k]
        options, size = (
            (_BATCH_OPTIONS, _BATCH_BUFFER) if batch else (_SINGLE_OPTIONS, _SINGLE_BUFFER)
        )
        why = "it is truncated, corrupt or not an ArrayRecord file"
        try:
            r = _module().ArrayRecordReader(
                path, self._options(options), file_reader_buffer_size=size
            )
        except (RuntimeError, ValueError, OSError) as e:
            why = f"{e}; {why}"
            r = None
        if r is None or not r.ok() or not isinstance(r.writer_options_string(), str):
            # The reader does not say why; name what a plain open can tell (missing, a
            # directory, unreadable: FileGuard raises), else the file itself is bad.
            guard = FileGuard(path, "an ArrayRecord file", lease=False)
            empty = guard.size == 0
            guard.close()
            if empty:
                why = "the file is empty (0 bytes); it was never written"
            raise DataError(
                f"{path}: cannot open as an ArrayRecord file: {why}; re-create it or "
                "restore a good copy"
            )
        return r

    def _reader(self, k: int, batch: bool = False) -> Any:
        local = self._local
        readers = getattr(local, "batch" if batch else "single", None)
        if readers is None:
            readers = [None] * len(self._paths)
            setattr(local, "batch" if batch else "single", readers)
        r = readers[k]
        if r is None:
            r = readers[k] = self._new_reader(k, batch)
        return r

    def _open(self) -> Concat:
        with self._lock:
            if self._concat is None:
                counts = []
                remote = open_concurrently(
                    lambda k: self._remote_entry(k) if is_url(self._paths[k]) else None,
                    self._paths,
                )
                for k, entry in enumerate(remote):
                    if entry is not None:
                        counts.append(len(entry[0]) // 4)
                        self._groups.append(1)
                        continue
                    r = self._reader(k)
                    counts.append(int(r.num_records()))
                    self._groups.append(_group_size(r.writer_options_string() or ""))
                self._concat = Concat(counts)
                self._fast_len = counts[0] if len(counts) == 1 else 0
            return self._concat

    def _direct_entry(self, k: int) -> _Direct | None:
        """File k's direct-read index, scanned on its first read (not on `len`)."""
        if k in self._spans:
            return self._spans[k]
        with self._lock:
            if k not in self._spans:
                assert self._concat is not None
                n = self._concat.counts[k]
                entry = self._scan(k, n) if self._direct and self._groups[k] == 1 else None
                self._spans[k] = entry
                if entry is not None and len(self._paths) == 1:
                    self._fast_direct = (n, *entry)
            return self._spans[k]

    def _remote_entry(self, k: int) -> _Direct:
        """File k's direct-read index and object, for a remote file (on `len`)."""
        f = RemoteFile(self._paths[k], self._storage, "an ArrayRecord file")
        zstd = self._zstd()
        spans = cached_remote_index(
            f.url, f.identity, "arrayrecord-crc", lambda: _remote_spans(f, zstd)
        )
        entry: _Direct = (array.array("q", spans.tobytes()), f, f)
        self._spans[k] = entry
        if len(self._paths) == 1:
            self._fast_direct = (len(spans) // 4, *entry)
        return entry

    def _scan(self, k: int, n: int) -> _Direct | None:
        path = self._paths[k]
        if n == 0 or self._zstd() is None:
            return None
        guard = FileGuard(path, "an ArrayRecord file")
        try:
            mm = guard.mapping() if guard.size else None
        except BaseException:
            guard.close()
            raise
        spans = cached_index(
            path,
            "arrayrecord-crc",
            lambda: scan_single_record_chunks(mm, self._reader(k), n),
            check=lambda s: riegeli_spans_agree(mm, self._reader(k), s, self._zstd()),
        )
        if mm is None or len(spans) != 4 * n:
            if mm is not None:
                mm.close()
            guard.close()
            return None
        return array.array("q", spans.tobytes()), mm, guard

    def _zstd(self) -> Any:
        d = getattr(self._local, "zstd", None)
        if d is None:
            try:
                import zstandard
            except ImportError:
                return None
            d = self._local.zstd = zstandard.ZstdDecompressor()
        return d

    def _read_direct(self, k: int, i: int) -> bytes | None:
        entry = self._direct_entry(k)
        if entry is None:
            return None
        spans, mm, guard = entry
        if not guard.leased and _lseek(guard.fd, 0, _SEEK_END) < guard.size:  # else SIGBUS
            raise guard.error(i)
        j = 4 * i
        try:
            return decode_record(
                mm, spans[j], spans[j + 1], spans[j + 2], spans[j + 3], self._zstd()
            )
        except ValueError as e:
            raise self._error(k, i, e) from None

    def record_location(self, index: int) -> dict[str, Any]:
        """Where record `index` is stored: its file, the file's number (shard) and the
        record's number in it (what `chute.experimental.provenance` shows)."""
        k, i = (self._concat or self._open()).locate(index, self)
        return {"file": self._paths[k], "shard": k, "record": i}

    def __len__(self) -> int:
        return len(self._concat or self._open())

    def _error(self, k: int, i: int, e: Exception) -> DataError:
        return DataError(
            f"{self._paths[k]}: record {i} could not be read ({e}); the file is corrupt or "
            "truncated; re-create it or restore a good copy"
        )

    def _chunk(self, k: int, i: int) -> list[bytes]:
        g = self._groups[k]
        key = (k, i // g)
        with self._lock:
            chunk = self._chunks.get(key)
            if chunk is not None:
                self._chunks.move_to_end(key)
                return chunk
        start = key[1] * g
        assert self._concat is not None
        end = min(start + g, self._concat.counts[k])
        try:
            chunk = list(self._reader(k).read(start, end))
        except (RuntimeError, ValueError) as e:
            raise self._error(k, i, e) from None
        with self._lock:
            self._chunks[key] = chunk
            while len(self._chunks) > self._chunk_cache_size:
                self._chunks.popitem(last=False)
        return chunk

    def __getitem__(self, index: int) -> bytes:
        direct = self._fast_direct
        if direct is not None:
            n, spans, mm, guard = direct
            if 0 <= index < n:
                if not guard.leased and _lseek(guard.fd, 0, _SEEK_END) < guard.size:
                    raise guard.error(index)  # a truncated map: SIGBUS
                j = 4 * index
                try:
                    out = decode_record(
                        mm, spans[j], spans[j + 1], spans[j + 2], spans[j + 3], self._zstd()
                    )
                except ValueError as e:
                    raise self._error(0, index, e) from None
                if out is not None:
                    return out
        # Fast path: one file of group size 1, this thread's reader already open.
        fast = getattr(self._local, "fast", None)
        if fast is not None and 0 <= index < self._fast_len:
            try:
                fast.seek(index)
                record: bytes = fast.read()
            except (RuntimeError, ValueError) as e:
                raise self._error(0, index, e) from None
            return record
        return self._getitem(index)

    def _getitem(self, index: int) -> bytes:
        concat = self._concat or self._open()
        k, i = concat.locate(index, self)
        if self._groups[k] > 1:
            return self._chunk(k, i)[i % self._groups[k]]
        out = self._read_direct(k, i)
        if out is not None:
            return out
        r = self._reader(k)
        if len(self._paths) == 1 and self._groups[0] == 1:
            self._local.fast = r
        try:
            r.seek(i)
            data: bytes = r.read()
        except (RuntimeError, ValueError) as e:
            raise self._error(k, i, e) from None
        return data

    def _getitems_remote(self, concat: Concat, indices: Sequence[int]) -> list[bytes]:
        """A block of reads of remote files: every record's bytes fetched at once
        (`read_many`: one round of concurrent range requests for what the block cache
        lacks), then each decoded and checked as a local direct read is. Records of files
        read otherwise (grouped chunks, local files) are read one by one."""
        located = [concat.locate(int(g), self) for g in indices]
        items: list[tuple[RemoteFile, int, int]] = []
        plan: list[tuple[int, int, array.array[int]] | None] = []  # (file, record, spans)
        for k, i in located:
            entry = self._spans.get(k) if self._groups[k] == 1 else None
            if entry is None or not isinstance(entry[2], RemoteFile):
                plan.append(None)
                continue
            pos, size = entry[0][4 * i], entry[0][4 * i + 1]
            items.append((entry[2], pos, record_extent(pos, size)))
            plan.append((k, i, entry[0]))
        raws = iter(read_many(items))
        zstd = self._zstd()
        out: list[bytes] = []
        for g, step in zip(indices, plan):
            if step is None:
                out.append(self[int(g)])
                continue
            k, i, spans = step
            j = 4 * i
            try:
                record = decode_record_from(
                    next(raws), spans[j], spans[j + 1], spans[j + 2], spans[j + 3], zstd
                )
            except ValueError as e:
                raise self._error(k, i, e) from None
            out.append(record if record is not None else self._getitem(int(g)))
        return out

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        concat = self._concat or self._open()
        if self._remote:  # remote files are always read directly
            return self._getitems_remote(concat, indices)
        if len(indices) < self._batch_threshold or self._direct:
            return [self[i] for i in indices]
        by_file: dict[int, tuple[list[int], list[int]]] = {}
        for pos, g in enumerate(indices):
            k, i = concat.locate(g, self)
            slots, local = by_file.setdefault(k, ([], []))
            slots.append(pos)
            local.append(i)
        out: list[Any] = [None] * len(indices)
        for k, (slots, local) in by_file.items():
            if self._groups[k] > 1:
                records = [self._chunk(k, i)[i % self._groups[k]] for i in local]
            else:
                try:
                    records = self._reader(k, batch=True).read(local)
                except (RuntimeError, ValueError) as e:
                    raise self._error(k, local[0], e) from None
            for pos, rec in zip(slots, records):
                out[pos] = rec
        return out

    @property
    def reads_in_flight(self) -> int:
        """Reads a pipeline should keep in flight from the start (`_src/core/in_flight.py`):
        many for remote files (each read waits a round trip), none for local ones."""
        return reads_in_flight_for(self._paths)

    def __repr__(self) -> str:
        p = self._paths
        shown = repr(p[0]) if len(p) == 1 else f"<{len(p)} files: {p[0]!r}, ...>"
        return f"ArrayRecordDataSource({shown})"
