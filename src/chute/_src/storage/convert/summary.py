"""What `chute inspect` and `chute verify` report about a dataset, in any format.

Both take files, globs and directories: a directory with a `manifest.json` is a dataset
(its shards, as the manifest lists them), any other directory stands for the data files
in it (hidden files, such as index caches older versions wrote, left out). A file's
format comes from its name, else its first bytes, unless `--from` names it."""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from chute._src.core.errors import DataError
from chute._src.storage.convert.inputs import Format, detect_format, iter_blocks, open_source
from chute._src.storage.formats._open import open_data
from chute._src.storage.formats._paths import expand_paths
from chute._src.storage.formats.crec import RecordFileDataSource
from chute._src.storage.records.layout import Codec
from chute._src.storage.records.manifest import MANIFEST_NAME, manifest_shard_format, read_manifest
from chute._src.storage.records.shard_files import dataset_paths
from chute._src.storage.remote.urls import StorageOptions, is_url, local_path

__all__ = ["dataset_files", "inspect_lines", "verify_any"]


def dataset_files(inputs: list[str], who: str, storage_options: StorageOptions = None) -> list[str]:
    """`inputs` with globs expanded and each local directory without a manifest replaced
    by the data files in it, sorted (hidden files and subdirectories left out)."""
    out: list[str] = []
    for p in expand_paths(inputs, who, storage_options):
        path = local_path(p)
        if is_url(p) or not os.path.isdir(path) or os.path.lexists(Path(path) / MANIFEST_NAME):
            out.append(p)
            continue
        with os.scandir(path) as entries:
            files = sorted(e.path for e in entries if not e.name.startswith(".") and e.is_file())
        if not files:
            raise DataError(
                f"{p}: the directory holds no data files; give a directory of data files, a "
                "dataset directory chute wrote (with manifest.json), files or a glob"
            )
        out.extend(files)
    return _without_listed_shards(out)


def _without_listed_shards(paths: list[str]) -> list[str]:
    """`paths` less the shards a manifest among them lists (`DIR/*` matches a dataset's
    manifest.json and its shards: the records are counted once)."""
    listed: set[str] = set()
    for p in paths:
        manifest = Path(local_path(p))
        if manifest.is_dir():
            manifest = manifest / MANIFEST_NAME
        if is_url(p) or manifest.name != MANIFEST_NAME or not manifest.is_file():
            continue
        with contextlib.suppress(DataError):  # a bad manifest: its reader reports it
            shards = read_manifest(manifest, manifest_shard_format(manifest))
            listed.update(os.path.realpath(shard) for shard, _ in shards)
    if not listed:
        return paths
    return [p for p in paths if is_url(p) or os.path.realpath(local_path(p)) not in listed]


def _one_format(paths: list[str], storage_options: StorageOptions) -> Format:
    """The format of every file of `paths` (by name, else first bytes); they must agree."""
    found = {p: detect_format(p, storage_options) for p in paths}
    formats = sorted({f.value for f in found.values()})
    if len(formats) > 1:
        examples = "; ".join(
            f"{f}: {next(p for p, g in found.items() if g.value == f)}" for f in formats
        )
        raise ValueError(
            f"the files mix formats ({examples}); give the files of one format (a glob such "
            "as DIR/*.jsonl), or pass --from FORMAT to read them all as one"
        )
    return next(iter(found.values()))


def _data_files(paths: list[str], fmt: Format, who: str, so: StorageOptions) -> list[str]:
    """The files holding the records: a dataset directory's shards, as its manifest
    lists them (checked against it), for the formats a manifest lists."""
    if fmt in (Format.CREC, Format.ARRAY_RECORD):
        return dataset_paths(paths, fmt.value, who, so)
    return paths


def _files_size(paths: list[str], so: StorageOptions) -> int:
    """The bytes of the files at `paths`, through the readers' opener (URLs too)."""
    total = 0
    for p in paths:
        f = open_data(p, "a data file", so, lease=False)
        total += f.size
        f.close()
    return total


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
    paths = dataset_files(inputs, "chute inspect", so)
    fmt = fmt or _one_format(paths, so)
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
        data = _data_files(paths, fmt, "chute inspect", so)
        src = open_source(data, fmt, so)
        n = len(src)
        lines += [
            f"files:    {len(data)}",
            f"records:  {n:,}",
            f"size:     {_files_size(data, so):,} bytes on disk",
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
    from chute._src.storage.records.verify import verify

    so = storage_options
    paths = dataset_files(inputs, "chute verify", so)
    fmt = fmt or _one_format(paths, so)
    if fmt is Format.CREC:
        return verify(paths, progress, so), "every checksum matches"
    from chute import sources

    data = _data_files(paths, fmt, "chute verify", so)  # shards checked against a manifest
    if fmt is Format.JSONL:
        src: Any = sources.JsonlDataSource(data, storage_options=so)
    else:
        src = open_source(data, fmt, so)
    for block in iter_blocks(src):
        if progress is not None:
            progress(len(block), sum(len(r) if isinstance(r, bytes) else 0 for r in block))
    if fmt is Format.TFRECORD:
        return len(src), "every checksum matches"
    if fmt is Format.JSONL:
        return len(src), "every line is valid JSON"
    return len(src), "every record reads"
