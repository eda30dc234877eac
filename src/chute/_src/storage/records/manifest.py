"""The `manifest.json` of a sharded `.crec` dataset: shard names, counts, checksums."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chute._src.core.errors import DataError
from chute._src.storage.remote.urls import StorageOptions

__all__ = [
    "MANIFEST_NAME",
    "SHARD_FORMATS",
    "ShardEntry",
    "existing_shards",
    "manifest_shard_format",
    "read_manifest",
    "read_remote_manifest",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
_FORMAT = "chute-records"
# What the shards of a manifest are: `.crec` files (the default, no key written) or
# ArrayRecord files (`"shard_format": "arrayrecord"`), and the source that reads each.
SHARD_FORMATS = {
    "crec": "chute.sources.RecordFileDataSource",
    "arrayrecord": "chute.sources.ArrayRecordDataSource",
}


@dataclass(frozen=True)
class ShardEntry:
    """One shard: its file name (relative to the manifest), records, size, trailer CRC.

    For a `.crec` shard `trailer_crc32c` is the trailer's own CRC (a checksum of the whole
    file); for an ArrayRecord shard it is the CRC32C of the file's last 4096 bytes before
    its zero padding (its footer: the chunk index), which tells a swapped or rewritten
    shard from the listed one.
    """

    name: str
    num_records: int
    size: int
    trailer_crc32c: int


def write_manifest(directory: Path, shards: list[ShardEntry], shard_format: str = "crec") -> Path:
    """Writes `manifest.json` atomically into `directory`."""
    doc: dict[str, object] = {
        "format": _FORMAT,
        "version": 1,
        "num_records": sum(s.num_records for s in shards),
        "shards": [asdict(s) for s in shards],
    }
    if shard_format != "crec":
        doc["shard_format"] = shard_format
    from chute._src.storage.records import staging

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


_FIX = (
    "re-create the dataset with chute.records.ShardedRecordWriter or `chute convert`, or "
    "write the manifest of a directory of shards with `chute verify --write-manifest DIR`"
)


def _load(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(
            f"{path.parent}: no {MANIFEST_NAME}: a sharded dataset needs its manifest; the "
            f"write was interrupted or this is not a chute dataset; {_FIX}"
        ) from None
    return _parse(raw, str(path))


def _parse(raw: bytes, path: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: the manifest is not valid JSON ({e}); {_FIX}") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("version") != 1:
        got = doc if not isinstance(doc, dict) else doc.get("format")
        version = doc.get("version") if isinstance(doc, dict) else None
        raise DataError(
            f"{path}: not a chute manifest (format={got!r}, version={version!r}, expected "
            f"{_FORMAT!r} version 1); {_FIX}"
        )
    return doc


def manifest_shard_format(path: Path) -> str:
    """What the shards the manifest at `path` lists are: "crec" or "arrayrecord"."""
    return _shard_format(_load(path), str(path))


def _shard_format(doc: dict[str, Any], path: str) -> str:
    fmt = doc.get("shard_format", "crec")
    if fmt not in SHARD_FORMATS:
        raise DataError(
            f"{path}: shard_format {fmt!r} is unknown (this chute reads "
            f"{', '.join(SHARD_FORMATS)}); upgrade chute or {_FIX}"
        )
    return str(fmt)


def read_manifest(path: Path, shard_format: str = "crec") -> list[tuple[Path, ShardEntry]]:
    """Reads a manifest; returns each shard's absolute path and entry.

    Raises `DataError` if its shards are not `shard_format`, naming the source to use.
    """
    entries = _entries(_load(path), str(path), shard_format)
    return [(path.parent / name, entry) for name, entry in entries]


def read_remote_manifest(
    url: str, storage_options: StorageOptions, shard_format: str = "crec"
) -> list[tuple[str, ShardEntry]]:
    """`read_manifest` for a manifest at a URL: each shard's URL and entry."""
    from chute._src.storage.remote.file import RemoteFile

    f = RemoteFile(url, storage_options, "a chute manifest")
    parent = url.rsplit("/", 1)[0]
    entries = _entries(_parse(f[:], url), url, shard_format)
    return [(f"{parent}/{name}", entry) for name, entry in entries]


def _entries(doc: dict[str, Any], path: str, shard_format: str) -> list[tuple[str, ShardEntry]]:
    """Each shard's name (relative to the manifest's directory) and entry."""
    fmt = _shard_format(doc, path)
    if fmt != shard_format:
        raise DataError(
            f"{path}: the manifest lists {fmt} shards, not {shard_format}; open the "
            f"directory with {SHARD_FORMATS[fmt]}"
        )
    try:
        out = []
        for s in doc["shards"]:
            entry = ShardEntry(
                str(s["name"]), int(s["num_records"]), int(s["size"]), int(s["trailer_crc32c"])
            )
            if os.path.isabs(entry.name) or ".." in Path(entry.name).parts:
                raise DataError(
                    f"{path}: shard name {entry.name!r} leaves the dataset directory; "
                    f"shard names must be relative; {_FIX}"
                )
            out.append((entry.name, entry))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: malformed manifest ({e!r}); {_FIX}") from None
    return out
