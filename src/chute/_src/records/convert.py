"""`convert`: copy records from any supported format into `.crec` (or ArrayRecord)."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chute._src.progress import Progress
from chute._src.records.format import crc32c
from chute._src.records.formats import (
    Format,
    as_bytes_source,
    detect_format,
    iter_blocks,
    open_source,
)
from chute._src.records.manifest import MANIFEST_NAME
from chute._src.records.writer import RecordWriter, ShardedRecordWriter
from chute._src.sources._paths import expand_paths

__all__ = ["ConvertResult", "convert"]

COMPRESSIONS = ("none", "zstd", "zstd-dict")


@dataclass(frozen=True)
class ConvertResult:
    records: int
    bytes_in: int
    bytes_out: int
    seconds: float
    outputs: list[str]
    resumed_records: int = 0


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size


def _check_output(output: Path, overwrite: bool) -> None:
    if not output.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{output} exists; pass --overwrite to replace it")
    if output.is_dir():
        if not (output / MANIFEST_NAME).exists() and any(
            not p.name.startswith(".") and not p.name.endswith((".crec", ".array_record"))
            for p in output.iterdir()
        ):
            raise FileExistsError(
                f"{output} is a directory holding other files; chute will not replace it"
            )
        shutil.rmtree(output)


def _crec_options(compression: str, level: int) -> dict[str, Any]:
    if compression not in COMPRESSIONS:
        raise ValueError(f"--compress {compression!r} is unknown; use one of {COMPRESSIONS}")
    if compression == "none":
        return {}
    return {"compression": "zstd", "level": level, "train_dictionary": compression == "zstd-dict"}


class _ArrayRecordOut:
    """Writes ArrayRecord files atomically (temporary name, then rename)."""

    def __init__(self, output: Path, shards: int, per_shard: int, compression: str) -> None:
        from chute._src.sources.array_record import _module

        self._module = _module()
        self._options = "group_size:1," + ("uncompressed" if compression == "none" else "zstd:3")
        self._output = output
        self._shards = shards
        self._per_shard = per_shard
        self._writer: Any = None
        self._count = 0
        self._done: list[tuple[Path, Path]] = []
        self.outputs: list[str] = []
        if shards > 1:
            output.mkdir(parents=True, exist_ok=True)

    def _target(self, k: int) -> Path:
        if self._shards == 1:
            return self._output
        return self._output / f"part-{k:05d}-of-{self._shards:05d}.array_record"

    def write(self, record: bytes) -> None:
        if self._writer is None or (self._shards > 1 and self._count % self._per_shard == 0):
            self._finish()
            target = self._target(len(self._done))
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
            self._writer = self._module.ArrayRecordWriter(str(tmp), self._options)
            self._current = (tmp, target)
        self._writer.write(record)
        self._count += 1

    def _finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._done.append(self._current)

    def close(self) -> None:
        if self._writer is None and not self._done:
            self.write_empty()
        self._finish()
        for tmp, target in self._done:
            os.replace(tmp, target)
            self.outputs.append(str(target))

    def write_empty(self) -> None:
        target = self._target(0)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.partial")
        self._writer = self._module.ArrayRecordWriter(str(tmp), self._options)
        self._current = (tmp, target)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._done.append(self._current)
        for tmp, _ in self._done:
            tmp.unlink(missing_ok=True)


def convert(
    inputs: list[str],
    output: str,
    *,
    from_format: Format | None = None,
    to_format: Format | None = None,
    shards: int = 1,
    compression: str = "none",
    level: int = 3,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
) -> ConvertResult:
    """Converts `inputs` (all of one format) into `output`; see `chute convert --help`.

    Every output file is written atomically. With `resume=True` a sharded `.crec`
    conversion keeps the complete shards an interrupted run of the same job (same
    inputs, unchanged, and options) left behind and writes only the rest.
    """
    if shards < 1:
        raise ValueError(f"--shards {shards} is invalid; give 1 or more")
    paths = expand_paths(inputs, "chute convert")
    if from_format is None:
        found = {detect_format(p) for p in paths}
        if len(found) > 1:
            names = ", ".join(sorted(f.value for f in found))
            raise ValueError(f"the inputs mix formats ({names}); convert them separately")
        from_format = found.pop()
    out = Path(output)
    if to_format is None:
        try:
            to_format = detect_format(out) if out.suffix else Format.CREC
        except ValueError:
            to_format = Format.CREC
    if to_format not in (Format.CREC, Format.ARRAY_RECORD):
        raise ValueError(f"chute convert writes crec or arrayrecord, not {to_format.value}")
    single_file = shards == 1 and out.suffix in (".crec", ".array_record", ".arrayrecord")
    if resume and (single_file or to_format is not Format.CREC):
        raise ValueError(
            "--resume works for sharded .crec output (a directory, with --shards N); a "
            "single file is written atomically, so just run the conversion again"
        )
    if not resume:
        _check_output(out, overwrite)
    source, metadata = as_bytes_source(open_source(paths, from_format), from_format)
    n = len(source)
    per_shard = max(1, math.ceil(n / shards))
    if not single_file and to_format is Format.CREC:
        job = [[os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in paths]
        key = json.dumps([job, from_format.value, compression, level, per_shard]).encode()
        metadata = {**metadata, "job": f"{crc32c(key):08x}"}
    writer: Any
    if to_format is Format.ARRAY_RECORD:
        writer = _ArrayRecordOut(out, 1 if single_file else shards, per_shard, compression)
    elif single_file:
        writer = RecordWriter(out, metadata=metadata, **_crec_options(compression, level))
    else:
        writer = ShardedRecordWriter(
            out,
            records_per_shard=per_shard,
            metadata=metadata,
            resume=resume,
            **_crec_options(compression, level),
        )
    skip = len(writer) if isinstance(writer, ShardedRecordWriter) else 0
    start = time.perf_counter()
    bytes_in = 0
    bar: Progress[Any] = Progress(total=n, desc="convert", force=progress)
    bar.update(skip)
    try:
        for block in iter_blocks(source, start=skip):
            nbytes = 0
            for record in block:
                writer.write(record)
                nbytes += len(record)
            bytes_in += nbytes
            bar.update(len(block), nbytes)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    if to_format is Format.ARRAY_RECORD:
        outputs = writer.outputs
    else:
        outputs = [str(out)]
    return ConvertResult(n, bytes_in, _size(out), seconds, outputs, skip)
