"""What `chute inspect` and `chute verify` report about a dataset, in any format."""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.records.inputs import Format, detect_format, iter_blocks, open_source
from chute._src.records.layout import Codec
from chute._src.remote.urls import StorageOptions, is_url
from chute._src.sources._paths import expand_paths
from chute._src.sources.crec import RecordFileDataSource

__all__ = ["inspect_lines", "verify_any"]


def _files_size(paths: list[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if not is_url(p) and os.path.isfile(p))


def _show(record: Any, width: int = 100) -> str:
    if isinstance(record, np.ndarray):
        text = f"array(shape={list(record.shape)}, dtype={record.dtype}) {record.ravel()[:8]}"
    else:
        text = repr(record)
    return text if len(text) <= width else text[: width - 3] + "..."


def inspect_lines(
    inputs: list[str], fmt: Format | None, show: int = 3, storage_options: StorageOptions = None
) -> list[str]:
    """Lines describing the dataset at `inputs`: format, counts, sizes, codecs, records."""
    so = storage_options
    paths = expand_paths(inputs, "chute inspect", so)
    fmt = fmt or detect_format(paths[0])
    lines = [f"format:   {fmt.value}"]
    if fmt is Format.CREC:
        src = RecordFileDataSource(paths, storage_options=so)
        files = src._open()
        n = len(src)
        stored = sum(int(np.frombuffer(f.lengths, dtype="<u4").sum()) for f in files)
        raw = sum(int(np.frombuffer(f.raw_lengths, dtype="<u4").sum()) for f in files)
        sizes = np.concatenate([np.frombuffer(f.raw_lengths, dtype="<u4") for f in files])
        codecs: collections.Counter[str] = collections.Counter()
        for f in files:
            counts = np.bincount(np.frombuffer(f.codecs, dtype=np.uint8), minlength=3)
            for c in Codec:
                codecs[c.name.lower()] += int(counts[c])
        dict_bytes = sum(len(f.dictionary or b"") for f in files)
        total_size = sum(f.size for f in files)
        lines += [
            f"files:    {len(files)}",
            f"records:  {n:,}",
            f"size:     {total_size:,} bytes on disk; payloads {stored:,} stored, {raw:,} decoded",
        ]
        if n:
            lines.append(
                f"record:   min {int(sizes.min()):,} / mean {sizes.mean():,.1f} / "
                f"max {int(sizes.max()):,} bytes"
            )
        lines.append(
            "codec:    "
            + ", ".join(f"{k} {v:,}" for k, v in codecs.items() if v)
            + (f"; zstd dictionary {dict_bytes:,} bytes" if dict_bytes else "")
        )
        if src.metadata:
            lines.append(f"metadata: {src.metadata}")
    else:
        src = open_source(paths, fmt, so)
        n = len(src)
        lines += [
            f"files:    {len(paths)}",
            f"records:  {n:,}",
            f"size:     {_files_size(paths):,} bytes on disk",
        ]
    for i in range(min(show, n)):
        lines.append(f"[{i}] {_show(src[i])}")
    return lines


def verify_any(
    inputs: list[str],
    fmt: Format | None,
    progress: Callable[[int, int], None] | None = None,
    storage_options: StorageOptions = None,
) -> tuple[int, str]:
    """Reads every record of the dataset, checking what its format can check.

    `.crec`: every record's CRC32C (and decompression). TFRecord: every CRC. JSONL: every
    line parses. ArrayRecord, Parquet, NumPy: every record decodes. Raises
    `chute.DataError` at the first bad record; returns the number of records and what
    was checked.
    """
    from chute._src.records.verify import verify

    so = storage_options
    paths = expand_paths(inputs, "chute verify", so)
    fmt = fmt or detect_format(paths[0])
    if fmt is Format.CREC:
        return verify(paths, progress, so), "every checksum matches"
    from chute import sources

    if fmt is Format.JSONL:
        src: Any = sources.JsonlDataSource(paths, storage_options=so)
    else:
        src = open_source(paths, fmt, so)
    for block in iter_blocks(src):
        if progress is not None:
            progress(len(block), sum(len(r) if isinstance(r, bytes) else 0 for r in block))
    if fmt is Format.TFRECORD:
        return len(src), "every checksum matches"
    if fmt is Format.JSONL:
        return len(src), "every line is valid JSON"
    return len(src), "every record reads"
