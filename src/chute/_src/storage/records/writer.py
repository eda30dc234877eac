"""`RecordWriter` and `ShardedRecordWriter`: write `.crec` files atomically."""

from __future__ import annotations

import array
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from chute._src.storage.records import manifest as _manifest
from chute._src.storage.records import staging
from chute._src.storage.records.checksum import crc32c
from chute._src.storage.records.codecs import Compression, Encoder, train_dictionary
from chute._src.storage.records.layout import (
    HEADER_MAGIC,
    MAX_ALIGNMENT,
    MAX_RECORD_SIZE,
    Header,
    Trailer,
    align_up,
)
from chute._src.storage.remote.calls import call
from chute._src.storage.remote.urls import StorageOptions, filesystem, is_url, local_path

__all__ = ["RecordWriter", "ShardedRecordWriter"]

_DICT_SAMPLE_RECORDS = 4096
_DICT_SAMPLE_BYTES = 8 * 1024 * 1024
_ZEROS = bytes(MAX_ALIGNMENT)


def _as_compression(value: Compression | str | None) -> Compression:
    if value is None:
        return Compression.NONE
    if isinstance(value, Compression):
        return value
    try:
        return Compression(value)
    except ValueError:
        names = ", ".join(repr(c.value) for c in Compression)
        raise ValueError(f"compression={value!r} is unknown; use one of {names}") from None


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RecordWriter:
    """Writes records (bytes) to one `.crec` file.

    The file appears under its name only when the writer closes without an error: it is
    written under a temporary name, flushed to disk and renamed. With
    `compression="zstd"` each record is stored compressed when that saves space; with
    `train_dictionary=True` a zstd dictionary is trained on the first records and stored
    in the file, which helps small records a lot.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "tiny.crec")
    >>> with RecordWriter(path) as w:
    ...     w.write(b"hello")
    ...     w.write(b"world")
    0
    1
    >>> from chute.sources import RecordFileDataSource
    >>> RecordFileDataSource(path)[1]
    b'world'
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        compression: Compression | str | None = None,
        level: int = 3,
        train_dictionary: bool = False,
        dictionary: bytes | None = None,
        alignment: int = 8,
        metadata: Mapping[str, Any] | None = None,
        storage_options: StorageOptions = None,
    ) -> None:
        self.url: str | None = None
        self._staging_dir: str | None = None
        if is_url(path):
            # Written to a local temporary file, uploaded whole on close (a PUT is atomic).
            self.url, self._storage = str(path), storage_options
            filesystem(self.url, storage_options)  # a missing fsspec or s3fs fails now
            self._staging_dir = tempfile.mkdtemp(prefix="chute-writer-")
            path = os.path.join(self._staging_dir, self.url.rstrip("/").rsplit("/", 1)[-1])
        path = local_path(path)
        if alignment < 1 or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
            raise ValueError(
                f"alignment={alignment} is invalid: it must be a power of two in "
                f"[1, {MAX_ALIGNMENT}]; use 8 (the default) or 64 for SIMD-friendly views"
            )
        self.path = Path(path)
        self.compression = _as_compression(compression)
        if self.compression is Compression.NONE and (train_dictionary or dictionary):
            raise ValueError(
                "a zstd dictionary needs compression='zstd'; pass compression='zstd' too"
            )
        self._level = level
        self._train = train_dictionary and dictionary is None
        self._dictionary = dictionary
        self._alignment = alignment
        self._metadata = json.dumps(dict(metadata or {}), sort_keys=True).encode()
        self._encoder: Encoder | None = None
        if self.compression is Compression.ZSTD and not self._train:
            self._encoder = Encoder(level, dictionary)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._offsets = array.array("Q")
        self._lengths = array.array("I")
        self._raw_lengths = array.array("I")
        self._crcs = array.array("I")
        self._codecs = array.array("B")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = staging.temp_name(self.path)
        self._file: IO[bytes] | None = staging.create_locked(self._tmp)
        header = Header(alignment)
        self._file.write(header.pack())
        self._file.flush()  # the magic on disk is what lets a later write clean up after a kill
        self._pos = header.payload_start
        self._file.write(_ZEROS[: self._pos - len(header.pack())])
        self.bytes_in = 0

    def __len__(self) -> int:
        """The number of records written so far."""
        return len(self._codecs) + len(self._pending)

    @property
    def dictionary(self) -> bytes | None:
        """The zstd dictionary this writer uses (after training), if any."""
        return self._dictionary

    def write(self, record: bytes | bytearray | memoryview) -> int:
        """Appends `record` and returns its index in the file."""
        if self._file is None:
            raise ValueError(f"RecordWriter({str(self.path)!r}) is closed; open a new writer")
        data = bytes(record)
        if len(data) > MAX_RECORD_SIZE:
            raise ValueError(
                f"a record of {len(data)} bytes is too large for {self.path}: the limit is "
                f"{MAX_RECORD_SIZE} bytes; split it into several records"
            )
        index = len(self)
        self.bytes_in += len(data)
        if self._train:
            self._pending.append(data)
            self._pending_bytes += len(data)
            if len(self._pending) >= _DICT_SAMPLE_RECORDS or (
                self._pending_bytes >= _DICT_SAMPLE_BYTES
            ):
                self._flush_pending()
            return index
        self._append(data)
        return index

    def write_all(self, records: Iterable[bytes]) -> None:
        """Appends every record of `records`."""
        for r in records:
            self.write(r)

    def _flush_pending(self) -> None:
        if self._dictionary is None:
            self._dictionary = train_dictionary(self._pending)
        self._train = False
        self._encoder = Encoder(self._level, self._dictionary)
        pending, self._pending = self._pending, []
        for data in pending:
            self._append(data)

    def _append(self, data: bytes) -> None:
        assert self._file is not None
        codec, stored = (0, data) if self._encoder is None else self._encoder.encode(data)
        self._offsets.append(self._pos)
        self._lengths.append(len(stored))
        self._raw_lengths.append(len(data))
        self._crcs.append(crc32c(stored))
        self._codecs.append(codec)
        self._file.write(stored)
        end = self._pos + len(stored)
        self._pos = align_up(end, self._alignment)
        if self._pos != end:
            self._file.write(_ZEROS[: self._pos - end])

    def close(self) -> None:
        """Finishes the file: writes the index and trailer, syncs and renames it."""
        if self._file is None:
            return
        if self._train:
            self._flush_pending()
        f = self._file
        payload_end = self._pos
        dictionary = self._dictionary if self.compression is Compression.ZSTD else None
        dict_bytes = dictionary or b""
        f.write(dict_bytes)
        meta_offset = payload_end + len(dict_bytes)
        f.write(self._metadata)
        index_offset = align_up(meta_offset + len(self._metadata), 8)
        f.write(_ZEROS[: index_offset - meta_offset - len(self._metadata)])
        index_crc = 0
        for column in (
            self._offsets,
            self._lengths,
            self._raw_lengths,
            self._crcs,
            self._codecs,
        ):
            raw = column.tobytes()
            index_crc = crc32c(raw, index_crc)
            f.write(raw)
        trailer = Trailer(
            num_records=len(self._codecs),
            payload_end=payload_end,
            index_offset=index_offset,
            dict_offset=payload_end,
            dict_length=len(dict_bytes),
            meta_offset=meta_offset,
            meta_length=len(self._metadata),
            index_crc=index_crc,
            dict_crc=crc32c(dict_bytes),
            meta_crc=crc32c(self._metadata),
        )
        f.write(trailer.pack())
        f.flush()
        os.fsync(f.fileno())
        os.replace(self._tmp, self.path)  # still locked: no sweep can take it meanwhile
        f.close()
        self._file = None
        _fsync_dir(self.path.parent)
        self.size = os.path.getsize(self.path)
        self.trailer_crc = trailer.crc
        if self.url is not None:
            self._upload(self.url)

    def _upload(self, url: str) -> None:
        fs, fspath = filesystem(url, self._storage)
        try:
            call(url, "upload it", lambda: fs.put_file(str(self.path), fspath))
        finally:
            self._drop_staging()

    def _drop_staging(self) -> None:
        if self._staging_dir is not None:
            shutil.rmtree(self._staging_dir, ignore_errors=True)
            self._staging_dir = None

    def abort(self) -> None:
        """Drops the file being written; nothing appears under `path`."""
        if self._file is not None:
            self._file.close()
            self._file = None
            self._tmp.unlink(missing_ok=True)
        if self.url is not None:
            self._drop_staging()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if getattr(self, "_file", None) is not None:
            self.abort()

    def __repr__(self) -> str:
        return f"RecordWriter({str(self.path)!r}, compression={self.compression.value!r})"


class ShardedRecordWriter:
    """Writes records to a directory of `.crec` shards plus a `manifest.json`.

    A new shard starts every `records_per_shard` records (or once a shard holds
    `bytes_per_shard` input bytes). With `num_shards=S` the write has exactly `S` shards,
    named `part-00003-of-00016.crec` as `chute.beam` names them (empty ones added at the
    end), and `num_records=n` lays them out as `chute.beam` does: shard `k` holds records
    `[k*n//S, (k+1)*n//S)`. Each shard is written atomically, and the manifest
    (shard names, record counts, sizes and checksums) is written last: a directory
    without a manifest is an interrupted write, and readers refuse it. A dictionary
    trained for the first shard is reused by the others.

    Writing into a directory that already holds a chute dataset replaces it atomically:
    the new shards get names the old manifest does not use (`part-00000.crec`, or
    `part-00000.TOKEN.crec` when those are taken), the new manifest replaces the old one
    with `os.replace`, and only then are the old shards it listed removed (each only if it
    still has the size and checksum that manifest records). Readers see the old dataset
    or the new one, never a mix; if the write fails or is killed, the old one stays.
    Other files in the directory are never touched, and a `manifest.json` that is not
    chute's is refused (FileExistsError).

    With `resume=True` (and `records_per_shard` or `num_records`), complete shards left by
    an interrupted run are kept: consecutive shards from the first that open cleanly, hold
    exactly the records the layout gives them and carry the same `metadata`. `len(writer)`
    is then the number of records they hold; the caller skips that many and writes the
    rest. Without it, the shards of an interrupted run (proved by its journal, see
    `staging.py`) are removed.

    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> with ShardedRecordWriter(out, records_per_shard=2) as w:
    ...     for i in range(5):
    ...         _ = w.write(b"r%d" % i)
    >>> from chute.sources import RecordFileDataSource
    >>> src = RecordFileDataSource(out)
    >>> len(src), src[4]
    (5, b'r4')
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        records_per_shard: int | None = None,
        bytes_per_shard: int | None = None,
        num_shards: int | None = None,
        num_records: int | None = None,
        prefix: str = "part",
        resume: bool = False,
        **writer_options: Any,
    ) -> None:
        if records_per_shard is not None and records_per_shard < 1:
            raise ValueError(f"records_per_shard={records_per_shard} must be >= 1")
        if num_shards is not None and num_shards < 1:
            raise ValueError(f"num_shards={num_shards} must be >= 1")
        if num_records is not None and (
            num_shards is None or num_records < 0 or records_per_shard or bytes_per_shard
        ):
            raise ValueError(
                f"num_records={num_records} lays out num_shards shards: give it (>= 0) with "
                "num_shards, and without records_per_shard or bytes_per_shard"
            )
        if resume and records_per_shard is None and num_records is None:
            raise ValueError("resume=True needs records_per_shard, so shards line up")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        old = _manifest.existing_shards(self.directory)
        self._listed = {e.name for e in old or []}
        self._records_per_shard = records_per_shard
        self._bytes_per_shard = bytes_per_shard
        self._num_shards = num_shards
        self._num_records = num_records
        self._of = "" if num_shards is None else f"-of-{num_shards:05d}"
        self._prefix = prefix
        self._options = writer_options
        self._shards: list[_manifest.ShardEntry] = []
        self._writer: RecordWriter | None = None
        self._count = 0
        self._closed = False
        self._journal = self._start(resume)

    def _start(self, resume: bool) -> staging.Journal:
        """Cleans up after killed writers, adopts an interrupted run's shards if asked,
        and claims shard names no manifest, file or live writer uses."""
        d, prefix = self.directory, self._prefix
        shard_names = rf"{re.escape(prefix)}-\d{{5}}(?:-of-\d{{5}})?(?:\.[0-9a-f]{{8}})?\.crec"
        staging.sweep_temps(d, staging.temp_pattern(shard_names), (HEADER_MAGIC,))
        manifest_temps = staging.temp_pattern(re.escape(_manifest.MANIFEST_NAME))
        staging.sweep_temps(d, manifest_temps, (staging.MANIFEST_MAGIC,))
        dead, live = staging.Journal.scan(d, prefix)
        journal = None
        if resume:
            for candidate in [*dead, None]:
                suffix = candidate.suffix if candidate is not None else ""
                if suffix in live or not self._adopt(suffix):
                    continue
                if candidate is not None:
                    dead.remove(candidate)
                    journal = candidate
                else:
                    journal = staging.Journal.create(d, prefix, "")
                break
        for j in dead:
            j.remove_files(d, prefix, keep=self._listed)
        if journal is None:
            plain = re.compile(rf"{re.escape(prefix)}-\d{{5}}{self._of}\.crec")
            taken = "" in live or any(plain.fullmatch(e.name) for e in os.scandir(d))
            token = "." + os.urandom(4).hex() if taken else ""
            journal = staging.Journal.create(d, prefix, token)
        return journal

    def _name(self, k: int, suffix: str) -> str:
        return f"{self._prefix}-{k:05d}{self._of}{suffix}.crec"

    def _size(self, k: int) -> int | None:
        """The records shard `k` holds when full (None: no count limit)."""
        if self._num_records is not None and self._num_shards is not None:
            n, s = self._num_records, self._num_shards
            return (k + 1) * n // s - k * n // s
        return self._records_per_shard

    def _adopt(self, suffix: str) -> bool:
        from chute._src.core.errors import DataError
        from chute._src.storage.records.reader import CrecFile

        wanted = json.loads(json.dumps(dict(self._options.get("metadata") or {})))
        while True:
            name = self._name(len(self._shards), suffix)
            path = self.directory / name
            if name in self._listed or not path.is_file() or path.is_symlink():
                break
            try:
                f = CrecFile(str(path))
            except DataError:
                break
            try:
                ok = f.num_records == self._size(len(self._shards)) and f.metadata == wanted
                entry = _manifest.ShardEntry(name, f.num_records, f.size, f.trailer_crc())
                dictionary = f.dictionary
            finally:
                f.close()
            if not ok:
                break
            if not self._shards:
                self._first_dictionary = dictionary
            self._shards.append(entry)
            self._count += entry.num_records
        return bool(self._shards)

    def __len__(self) -> int:
        return self._count

    def _roll(self) -> RecordWriter:
        w = self._writer
        if w is not None and not self._full(w):
            return w
        if w is not None:
            self._finish_shard()
        w = self._open_shard()
        while self._size(len(self._shards)) == 0:  # a layout's empty shard: the next one
            self._finish_shard()
            w = self._open_shard()
        return w

    def _full(self, w: RecordWriter) -> bool:
        size = self._size(len(self._shards))
        full = size is not None and len(w) >= size
        return full or (self._bytes_per_shard is not None and w.bytes_in >= self._bytes_per_shard)

    def _open_shard(self) -> RecordWriter:
        k = len(self._shards)
        if self._num_shards is not None and k >= self._num_shards:
            most = self._num_records
            if most is None and self._records_per_shard is not None:
                most = self._num_shards * self._records_per_shard
            raise ValueError(
                f"{self.directory}: a write past the {self._num_shards} shards of "
                f"num_shards={self._num_shards} (they hold {self._count:,} records"
                + ("" if most is None else f"; the layout holds {most:,}")
                + "); give a num_shards or num_records that counts every record"
            )
        path = self.directory / self._name(k, self._journal.suffix)
        if os.path.lexists(path) or path.name in self._listed:
            raise FileExistsError(
                f"{path} exists and is not a shard of this write; chute will not replace it; "
                "move it away or write the dataset to another directory"
            )
        if self._shards and self._options.get("train_dictionary"):
            self._options = {
                **self._options,
                "dictionary": self._first_dictionary,
                "train_dictionary": False,
            }
        self._writer = RecordWriter(path, **self._options)
        return self._writer

    def _finish_shard(self) -> None:
        w = self._writer
        assert w is not None
        w.close()
        if not self._shards:
            self._first_dictionary = w.dictionary
        self._shards.append(_manifest.ShardEntry(w.path.name, len(w), w.size, w.trailer_crc))
        self._writer = None

    def write(self, record: bytes | bytearray | memoryview) -> int:
        """Appends `record`; returns its global index."""
        if self._closed:
            raise ValueError(f"ShardedRecordWriter({str(self.directory)!r}) is closed")
        self._roll().write(record)
        self._count += 1
        return self._count - 1

    def end_shard(self) -> None:
        """Ends the current shard, an empty one if no record went to it since the last
        cut; the next record starts the next shard. For a caller that cuts shards itself
        (`chute convert` cuts where a shard's input positions end)."""
        if self._closed:
            raise ValueError(f"ShardedRecordWriter({str(self.directory)!r}) is closed")
        if self._writer is None:
            self._open_shard()
        self._finish_shard()

    @property
    def shards(self) -> list[str]:
        """The names of the shards written (or kept) so far, in order."""
        return [s.name for s in self._shards]

    def close(self) -> None:
        """Finishes the last shard, commits the manifest, then removes the old shards."""
        if self._closed:
            return
        if self._writer is None and not self._shards:
            self._open_shard()  # an empty dataset is one empty shard, so it reads as empty
        if self._writer is not None:
            self._finish_shard()
        while len(self._shards) < (self._num_shards or 0):  # num_shards: every one is there
            self._open_shard()
            self._finish_shard()
        self._closed = True
        try:
            old = _manifest.existing_shards(self.directory) or []
        except FileExistsError:
            old = []  # replaced meanwhile by something that is not chute's: remove nothing
        _manifest.write_manifest(self.directory, self._shards)
        _fsync_dir(self.directory)
        new = {s.name for s in self._shards}
        for entry in old:
            if entry.name not in new:
                staging.remove_listed_shard(self.directory / entry.name, entry)
        self._journal.finish()

    def abort(self, *, keep_shards: bool = False) -> None:
        """Drops what this write produced; the directory's manifest is untouched.

        With `keep_shards=True` the complete shards stay (with their journal) for a
        later `resume=True` write to adopt; without, they are removed.
        """
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        self._closed = True
        if keep_shards:
            self._journal.release()
        else:
            self._journal.remove_files(self.directory, self._prefix, keep=self._listed)

    def __enter__(self) -> ShardedRecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort(keep_shards=issubclass(exc_type, KeyboardInterrupt))

    def __repr__(self) -> str:
        return f"ShardedRecordWriter({str(self.directory)!r})"
