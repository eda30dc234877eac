"""The `manifest.json` of a sharded `.crec` dataset: shard names, counts, checksums."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from chute._src.errors import DataError
from chute._src.remote.urls import StorageOptions

__all__ = [
    "MANIFEST_NAME",
    "ShardEntry",
    "existing_shards",
    "read_manifest",
    "read_remote_manifest",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
_FORMAT = "chute-records"


@dataclass(frozen=True)
class ShardEntry:
    """One shard: its file name (relative to the manifest), records, size, trailer CRC."""

    name: str
    num_records: int
    size: int
    trailer_crc32c: int


def write_manifest(directory: Path, shards: list[ShardEntry]) -> Path:
    """Writes `manifest.json` atomically into `directory`."""
    doc = {
        "format": _FORMAT,
        "version": 1,
        "num_records": sum(s.num_records for s in shards),
        "shards": [asdict(s) for s in shards],
    }
    from chute._src.records import staging

    path = directory / MANIFEST_NAME
    tmp = staging.temp_name(path)
    with staging.create_locked(tmp) as f:
        f.write((json.dumps(doc, indent=1) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
        os.replace(tmp, path)
    return path


def existing_shards(directory: Path) -> list[ShardEntry] | None:
    """The shards the manifest in `directory` lists; None if there is no manifest.

    Raises FileExistsError when `directory` holds a `manifest.json` that is not a valid
    chute manifest: it is someone else's file, and chute will not replace it.
    """
    path = directory / MANIFEST_NAME
    if not os.path.lexists(path):
        return None
    try:
        if not path.is_file() or path.is_symlink():
            raise DataError(f"{path}: not a regular file")
        return [entry for _, entry in read_manifest(path)]
    except DataError as e:
        raise FileExistsError(
            f"{path} is not a chute manifest ({e}); chute will not replace it, nor any "
            "file beside it: write the dataset to another directory"
        ) from None


def read_manifest(path: Path) -> list[tuple[Path, ShardEntry]]:
    """Reads a manifest; returns each shard's absolute path and entry."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(
            f"{path.parent}: no {MANIFEST_NAME}: a sharded .crec dataset needs its manifest; "
            f"the write was interrupted or this is not a chute dataset; {_FIX}"
        ) from None
    return [(path.parent / name, entry) for name, entry in _parse(raw, str(path))]


def read_remote_manifest(url: str, storage_options: StorageOptions) -> list[tuple[str, ShardEntry]]:
    """`read_manifest` for a manifest at a URL: each shard's URL and entry."""
    from chute._src.remote.file import RemoteFile

    f = RemoteFile(url, storage_options, "a chute manifest")
    parent = url.rsplit("/", 1)[0]
    return [(f"{parent}/{name}", entry) for name, entry in _parse(f[:], url)]


_FIX = "re-create the dataset with chute.records.ShardedRecordWriter or `chute convert`"


def _parse(raw: bytes, path: str) -> list[tuple[str, ShardEntry]]:
    """Each shard's name (relative to the manifest's directory) and entry."""
    fix = _FIX
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: the manifest is not valid JSON ({e}); {fix}") from None
    try:
        if doc.get("format") != _FORMAT or doc.get("version") != 1:
            raise DataError(
                f"{path}: not a chute manifest (format={doc.get('format')!r}, "
                f"version={doc.get('version')!r}, expected {_FORMAT!r} version 1); {fix}"
            )
        out = []
        for s in doc["shards"]:
            entry = ShardEntry(
                str(s["name"]), int(s["num_records"]), int(s["size"]), int(s["trailer_crc32c"])
            )
            if os.path.isabs(entry.name) or ".." in Path(entry.name).parts:
                raise DataError(
                    f"{path}: shard name {entry.name!r} leaves the dataset directory; "
                    f"shard names must be relative; {fix}"
                )
            out.append((entry.name, entry))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: malformed manifest ({e!r}); {fix}") from None
    return out
