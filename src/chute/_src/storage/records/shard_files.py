"""Shard files a manifest lists: their checksums and the checks made on opening them.

Shared by everything that writes or adopts shards (`chute.beam`, `write_manifest`, whose
entries `adopt.shard_entry` makes) and by the sources that open a dataset directory. A `.crec` shard's checksum is its
trailer's CRC; an ArrayRecord shard's is the CRC32C of its last `TAIL` bytes before
its zero padding (`tail_crc32c`).
"""

from __future__ import annotations

import os
from pathlib import Path

from chute._src.core.errors import DataError
from chute._src.storage.formats._paths import PathsArg, expand_paths, remote_manifest
from chute._src.storage.records.checksum import crc32c
from chute._src.storage.records.manifest import (
    MANIFEST_NAME,
    ShardEntry,
    manifest_shard_format,
    read_manifest,
    read_remote_manifest,
)
from chute._src.storage.remote.urls import StorageOptions, is_url

__all__ = ["TAIL", "dataset_paths", "tail_crc32c"]

TAIL = 4096
_PADDING = 1 << 16  # riegeli pads a file with zeros to its 64 KiB block boundary


def tail_crc32c(path: str | os.PathLike[str], size: int) -> int:
    """The CRC32C of the last `TAIL` bytes of the file at `path` before its zero padding
    (ArrayRecord pads a file with zeros to a 64 KiB block; the footer lies before them)."""
    span = min(size, _PADDING + TAIL)
    with open(path, "rb") as f:
        f.seek(size - span)
        data = f.read(span).rstrip(b"\0")
    return int(crc32c(data[-TAIL:]))


def _checksum(path: Path, size: int, shard_format: str) -> int:
    if shard_format == "crec":  # the trailer's own CRC32C: its last 4 bytes
        with open(path, "rb") as f:
            f.seek(max(0, size - 4))
            return int.from_bytes(f.read(4), "little")
    return tail_crc32c(path, size)


def _check_listed(path: Path, entry: ShardEntry, shard_format: str) -> None:
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataError(
            f"{path}: a shard the manifest lists cannot be read ({e.strerror}); restore it, "
            "or write the manifest again with `chute verify --write-manifest DIR`"
        ) from None
    if size != entry.size or _checksum(path, size, shard_format) != entry.trailer_crc32c:
        raise DataError(
            f"{path}: the shard is not the file the manifest lists (size {size}, the "
            f"manifest says {entry.size}, or its footer checksum differs); it was truncated "
            "or replaced: restore it, or write the manifest again with "
            "`chute verify --write-manifest DIR`"
        )


def dataset_paths(
    paths: PathsArg, shard_format: str, who: str, storage_options: StorageOptions = None
) -> list[str]:
    """`paths` expanded, a local dataset directory (or its manifest) replaced by the shards
    its manifest lists, each checked against its entry (size, checksum). URLs are kept."""
    out: list[str] = []
    for p in expand_paths(paths, who, storage_options):
        if is_url(p):  # a dataset directory in a store: the shards its manifest lists
            manifest = remote_manifest(p, storage_options)
            if manifest is None:
                out.append(p)
            else:
                out.extend(
                    u for u, _ in read_remote_manifest(manifest, storage_options, shard_format)
                )
            continue
        path = Path(p)
        if path.is_dir() and os.path.lexists(path / MANIFEST_NAME):
            path = path / MANIFEST_NAME  # (a directory without one: the reader names it)
        if path.name != MANIFEST_NAME:
            out.append(p)
            continue
        manifest_shard_format(path)  # a bad manifest is reported as such
        for shard, entry in read_manifest(path, shard_format):
            _check_listed(shard, entry, shard_format)
            out.append(str(shard))
    return out
