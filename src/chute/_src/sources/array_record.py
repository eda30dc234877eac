"""`ArrayRecordDataSource`: fast random access to ArrayRecord files (the `array-record` extra)."""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from chute._src.errors import DataError
from chute._src.sources._concat import Concat
from chute._src.sources._paths import PathsArg, expand_paths

__all__ = ["ArrayRecordDataSource"]

# Single reads: no readahead, no thread pool and a small buffer make seek+read a few
# microseconds; per-item `read([i])` costs hundreds (it sets up a parallel read).
_SINGLE_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"
_SINGLE_BUFFER = 4096
# Large batches go through the reader's own parallel `read(indices)`.
_BATCH_OPTIONS = "readahead_buffer_size:0"
_BATCH_BUFFER = 32768


def _module() -> Any:
    try:
        from array_record.python import array_record_module
    except ImportError as e:
        raise ImportError(
            "ArrayRecordDataSource needs array-record: pip install 'chute[arrayrecord]'"
        ) from e
    return array_record_module


def _group_size(options: str) -> int:
    m = re.search(r"group_size:(\d+)", options)
    return int(m.group(1)) if m else 1


class ArrayRecordDataSource:
    """Records of ArrayRecord files, as bytes, by global index across files.

    A drop-in for `grain.sources.ArrayRecordDataSource(paths, reader_options)`, built for
    random access: each thread keeps its own reader per file and reads one record with
    `seek` + `read` (microseconds, where `read([i])` costs hundreds), a batch of at
    least `batch_threshold` indices goes through the reader's parallel `read(indices)`,
    and files written with `group_size` > 1 are read a whole chunk at a time into a small
    cache of decoded chunks (`chunk_cache_size` chunks). Picklable, thread-safe.
    """

    def __init__(
        self,
        paths: PathsArg,
        reader_options: dict[str, str] | None = None,
        *,
        batch_threshold: int = 256,
        chunk_cache_size: int = 16,
    ) -> None:
        _module()
        self._paths = expand_paths(paths, "ArrayRecordDataSource")
        self._extra = ",".join(f"{k}:{v}" for k, v in (reader_options or {}).items())
        self._batch_threshold = batch_threshold
        self._chunk_cache_size = chunk_cache_size
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()
        self._concat: Concat | None = None
        self._groups: list[int] = []
        self._chunks: OrderedDict[tuple[int, int], list[bytes]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "paths": self._paths,
            "extra": self._extra,
            "batch_threshold": self._batch_threshold,
            "chunk_cache_size": self._chunk_cache_size,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._paths = state["paths"]
        self._extra = state["extra"]
        self._batch_threshold = state["batch_threshold"]
        self._chunk_cache_size = state["chunk_cache_size"]
        self._init_runtime()

    def _options(self, base: str) -> str:
        return f"{base},{self._extra}" if self._extra else base

    def _new_reader(self, k: int, batch: bool) -> Any:
        path = self._paths[k]
        options, size = (
            (_BATCH_OPTIONS, _BATCH_BUFFER) if batch else (_SINGLE_OPTIONS, _SINGLE_BUFFER)
        )
        try:
            return _module().ArrayRecordReader(
                path, self._options(options), file_reader_buffer_size=size
            )
        except (RuntimeError, ValueError, OSError) as e:
            raise DataError(
                f"{path}: cannot open as an ArrayRecord file ({e}); it is truncated, corrupt "
                "or not an ArrayRecord file; re-create it or restore a good copy"
            ) from None

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
                for k in range(len(self._paths)):
                    r = self._reader(k)
                    counts.append(int(r.num_records()))
                    self._groups.append(_group_size(r.writer_options_string()))
                self._concat = Concat(counts)
            return self._concat

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
        concat = self._concat or self._open()
        k, i = concat.locate(index, self)
        if self._groups[k] > 1:
            return self._chunk(k, i)[i % self._groups[k]]
        r = self._reader(k)
        try:
            r.seek(i)
            data: bytes = r.read()
        except (RuntimeError, ValueError) as e:
            raise self._error(k, i, e) from None
        return data

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        concat = self._concat or self._open()
        if len(indices) < self._batch_threshold:
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

    def __repr__(self) -> str:
        p = self._paths
        shown = repr(p[0]) if len(p) == 1 else f"<{len(p)} files: {p[0]!r}, ...>"
        return f"ArrayRecordDataSource({shown})"


def write_array_record(
    path: str | os.PathLike[str], records: Sequence[bytes], options: str = "group_size:1"
) -> None:
    """Writes `records` to an ArrayRecord file (needs the `array-record` extra)."""
    w = _module().ArrayRecordWriter(os.fspath(path), options)
    for r in records:
        w.write(r)
    w.close()
