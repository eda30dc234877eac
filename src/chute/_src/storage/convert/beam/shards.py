"""Shards of a parallel conversion: which positions each holds, writing one, finishing.

Nothing here imports Beam: a `ShardSpec` (small, picklable) is what every worker needs.
Shard `k` of `S` holds the records of positions `[k*n//S, (k+1)*n//S)` of the input's
global order (files in order, records in order), sorted by position, so the same input
gives the same shards byte for byte however many workers ran and in whatever order.
Records without positions (a plain PCollection, `num_positions=None`) are placed by their
content instead: a record's 8-byte BLAKE2b digest picks its shard (`digest % S`) and its
place in the shard (records sorted by digest, then bytes), so the same records give the
same shards byte for byte too, in whatever order the runner delivers them.

The output directory, through `records.outputs`:

- `.chute-job.json`, written when the job starts: the job's fingerprint. A rerun of the
  same job (same inputs, unchanged, and options) keeps every shard already complete and
  writes the rest; a directory claimed by another job is refused.
- `part-00003-of-00016.crec` (or `.array_record`): each written under a temporary name
  and renamed when complete, so a file under a shard's name is complete. A `.crec` shard
  records the job, its number and its positions in its metadata.
- `manifest.json`, written once every shard is committed; then the job file is removed.

A URL output (`s3://bucket/prefix`) is the same layout in an object store: each file is
written to a local temporary and uploaded whole (a PUT is atomic), so an object under a
shard's name is complete too; a kept shard is recognised by range reads of its header
and trailer (`.crec`) or a download (ArrayRecord).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chute._src.core.errors import DataError
from chute._src.storage.convert import outputs
from chute._src.storage.records import manifest as _manifest
from chute._src.storage.records import staging
from chute._src.storage.records.adopt import shard_entry
from chute._src.storage.records.layout import HEADER_MAGIC
from chute._src.storage.records.manifest import MANIFEST_NAME, ShardEntry
from chute._src.storage.records.shard_files import tail_crc32c
from chute._src.storage.remote.urls import StorageOptions, is_url

__all__ = ["JOB_FILE", "ShardSpec", "content_key", "finish", "prepare_output", "write_shard"]

JOB_FILE = ".chute-job.json"
_JOB_FORMAT = "chute-shard-job"
SUFFIXES = {"crec": ".crec", "arrayrecord": ".array_record"}


@dataclass(frozen=True)
class ShardSpec:
    """Where and how the shards of one job are written."""

    output: str
    num_shards: int
    num_positions: int | None  # None: records without positions, placed by content
    job_id: str
    shard_format: str = "crec"
    metadata_json: str = "{}"
    exact_counts: bool = True  # no Filter: shard k holds exactly its positions' records
    compression: str = "none"
    level: int = 3
    # For a URL output: fsspec options (credentials, endpoint), pickled to every worker.
    storage_options: StorageOptions = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.num_shards < 1:
            raise ValueError(f"num_shards={self.num_shards} is invalid; give 1 or more")
        if self.num_positions is not None and self.num_positions < 0:
            raise ValueError(
                f"num_positions={self.num_positions} is invalid; give the number of input "
                "records (0 or more), or leave it out for records without positions"
            )
        if self.shard_format not in SUFFIXES:
            raise ValueError(
                f"shard format {self.shard_format!r} is unknown; chute writes "
                f"{' or '.join(SUFFIXES)} shards"
            )

    @property
    def positioned(self) -> bool:
        """Whether records come as `(position, record)` and shards hold position ranges."""
        return self.num_positions is not None

    def bounds(self, k: int) -> tuple[int, int]:
        """The positions `[lo, hi)` shard `k` holds."""
        if self.num_positions is None:
            raise ValueError("shards of records without positions hold no position range")
        n, s = self.num_positions, self.num_shards
        return k * n // s, (k + 1) * n // s

    def starts(self) -> list[int]:
        return [self.bounds(k)[0] for k in range(self.num_shards)]

    def shard_of(self, index: int, starts: Sequence[int] | None = None) -> int:
        """The shard holding position `index`."""
        n = self.num_positions
        if n is None or not 0 <= index < n:
            raise ValueError(
                f"record position {index} is outside [0, {self.num_positions}): the records "
                "a shard writer gets are keyed by their position in the input"
            )
        # The last shard whose start is <= index (empty shards share a start).
        return bisect.bisect_right(starts or self.starts(), index) - 1

    def name(self, k: int) -> str:
        return f"part-{k:05d}-of-{self.num_shards:05d}{SUFFIXES[self.shard_format]}"

    def path(self, k: int) -> str:
        return outputs.join(self.output, self.name(k))

    def metadata(self, k: int) -> dict[str, Any]:
        meta = json.loads(self.metadata_json)
        meta = {**meta, "job": self.job_id, "shard": [k, self.num_shards]}
        if self.positioned:
            meta["positions"] = list(self.bounds(k))
        return meta

    def name_pattern(self) -> re.Pattern[str]:
        return re.compile(
            rf"part-\d{{5}}-of-{self.num_shards:05d}{re.escape(SUFFIXES[self.shard_format])}"
        )


def content_key(record: bytes, num_shards: int) -> tuple[int, bytes]:
    """The shard of a record without a position, and its sort key within the shard (its
    8-byte BLAKE2b digest): fixed by the record's bytes alone."""
    digest = hashlib.blake2b(record, digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards, digest


def _not_ours(path: str, why: str) -> FileExistsError:
    return FileExistsError(
        f"{path} exists and is not a complete shard of this job ({why}); chute never "
        "replaces a file it cannot prove its own: move it away, or write to a new directory"
    )


def complete_entry(spec: ShardSpec, k: int) -> ShardEntry | None:
    """The entry of shard `k` if an earlier attempt of this job committed it; None if it
    is not there. A file under its name that is not this job's raises FileExistsError."""
    path = spec.path(k)
    so = spec.storage_options
    if not outputs.exists(path, so):
        return None
    meta: dict[str, Any] | None = None  # a `.crec` shard's: it names its job and number
    try:
        if spec.shard_format == "crec":
            entry, meta = _crec_entry(spec, k)
        else:
            with outputs.local_copy(path, so) as local:
                entry = shard_entry(local, spec.shard_format)
    except (DataError, OSError) as e:
        raise _not_ours(path, f"it does not open: {e}") from None
    if meta is not None and (meta.get("job"), meta.get("shard")) != (
        spec.job_id,
        [k, spec.num_shards],
    ):
        raise _not_ours(path, f"its metadata names job {meta.get('job')!r}")
    if spec.positioned:
        lo, hi = spec.bounds(k)
        if (spec.exact_counts and entry.num_records != hi - lo) or entry.num_records > hi - lo:
            raise _not_ours(path, f"it holds {entry.num_records} records, not {hi - lo}")
    return entry


def _crec_entry(spec: ShardSpec, k: int) -> tuple[ShardEntry, dict[str, Any]]:
    """A `.crec` shard's entry and metadata, from its header and trailer (a remote shard
    is read by ranges, not downloaded)."""
    from chute._src.storage.records.reader import CrecFile

    f = CrecFile(spec.path(k), storage_options=spec.storage_options)
    try:
        return ShardEntry(spec.name(k), f.num_records, f.size, f.trailer_crc()), f.metadata
    finally:
        f.close()


def _crec_options(spec: ShardSpec) -> dict[str, Any]:
    from chute._src.storage.convert.convert import crec_options as options

    return options(spec.compression, spec.level)


def write_shard(spec: ShardSpec, k: int, records: Iterable[bytes]) -> ShardEntry:
    """Writes shard `k` atomically from `records` (in position order), unless an earlier
    attempt of the job committed it: then its entry, the file untouched."""
    done = complete_entry(spec, k)
    if done is not None:
        return done
    path = spec.path(k)
    with outputs.local_target(path, spec.storage_options) as local:
        if spec.shard_format == "crec":
            from chute._src.storage.records.writer import RecordWriter

            w = RecordWriter(local, metadata=spec.metadata(k), **_crec_options(spec))
            try:
                for r in records:
                    w.write(r)
            except BaseException:
                w.abort()
                raise
            w.close()
            return ShardEntry(spec.name(k), len(w), w.size, w.trailer_crc)
        count = _write_array_record(local, records, spec.compression)
        size = os.path.getsize(local)
        return ShardEntry(spec.name(k), count, size, tail_crc32c(local, size))


def _write_array_record(path: Path, records: Iterable[bytes], compression: str) -> int:
    from chute._src.storage.formats.array_record import _module

    options = "group_size:1," + ("uncompressed" if compression == "none" else "zstd:3")
    tmp = staging.temp_name(path)
    lock = staging.create_locked(tmp)  # held until renamed: no sweep takes it meanwhile
    try:
        writer = _module().ArrayRecordWriter(str(tmp), options)
        count = 0
        try:
            for r in records:
                writer.write(r)
                count += 1
        finally:
            writer.close()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        lock.close()
    return count


def _read_job(path: str, storage_options: StorageOptions) -> dict[str, Any] | None:
    try:
        doc = json.loads(outputs.read_bytes(path, storage_options))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == _JOB_FORMAT else None


def prepare_output(spec: ShardSpec) -> list[int]:
    """Checks and claims the output directory for this job (the driver calls it once,
    before any shard is written); returns the shards an earlier attempt completed."""
    out = spec.output
    so = spec.storage_options
    names = outputs.list_names(out, so)
    job_path = outputs.join(out, JOB_FILE)
    job = _read_job(job_path, so) if JOB_FILE in names else None
    if JOB_FILE in names and job is None:
        raise FileExistsError(f"{job_path} is not a chute job file; write to a new directory")
    if job is not None and job.get("job") != spec.job_id:
        raise FileExistsError(
            f"{out} holds the shards of an unfinished conversion with other inputs or options "
            f"(job {job.get('job')}, this one is {spec.job_id}); rerun that job to finish it, "
            "or write to a new directory (chute replaces no shard of another job)"
        )
    if job is None and MANIFEST_NAME in names:
        raise FileExistsError(
            f"{out} already holds a dataset ({MANIFEST_NAME}); write to a new directory"
        )
    ours = spec.name_pattern()
    others = [
        n for n in names if not n.startswith(".") and n != MANIFEST_NAME and not ours.fullmatch(n)
    ]
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise FileExistsError(
            f"{out} holds files that are not shards of this conversion ({shown}); chute "
            "writes a dataset only into a new or empty directory (or one an interrupted run "
            "of the same job left): give a new directory"
        )
    if job is None:
        outputs.make_dirs(out, so)
        with outputs.local_target(job_path, so) as local:
            tmp = staging.temp_name(local)
            with staging.create_locked(tmp) as f:
                doc = {"format": _JOB_FORMAT, "job": spec.job_id, "shards": spec.num_shards}
                f.write(json.dumps(doc).encode())
                f.flush()
                os.fsync(f.fileno())
                os.replace(tmp, local)
    if not is_url(out):  # an object store holds no temporaries: uploads are whole
        directory = Path(out)
        magic = HEADER_MAGIC if spec.shard_format == "crec" else staging.ARRAY_RECORD_MAGIC
        staging.sweep_temps(directory, staging.temp_pattern(ours.pattern), (magic,))
        manifest_temps = staging.temp_pattern(re.escape(MANIFEST_NAME))
        staging.sweep_temps(directory, manifest_temps, (staging.MANIFEST_MAGIC,))
    return [k for k in range(spec.num_shards) if complete_entry(spec, k) is not None]


def finish(spec: ShardSpec, written: Iterable[tuple[int, ShardEntry]]) -> str:
    """Commits the dataset once every shard is: shards with no record (all filtered, or
    fewer records than shards) and those an earlier attempt completed are found or
    written here; then the manifest, then the job file goes. Returns the manifest path."""
    entries = dict(written)
    for k in range(spec.num_shards):
        if k not in entries:
            entries[k] = write_shard(spec, k, [])
    listed = [entries[k] for k in range(spec.num_shards)]
    path = outputs.join(spec.output, MANIFEST_NAME)
    with outputs.local_target(path, spec.storage_options) as local:
        _manifest.write_manifest(local.parent, listed, spec.shard_format)
    outputs.remove(outputs.join(spec.output, JOB_FILE), spec.storage_options)
    return path
