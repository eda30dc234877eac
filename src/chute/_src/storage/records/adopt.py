"""`write_manifest(directory)`: shards written by any engine become a chute dataset."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from chute._src.core.errors import DataError
from chute._src.storage.convert import outputs
from chute._src.storage.convert.inputs import Format, detect_format
from chute._src.storage.records import manifest as _manifest
from chute._src.storage.records.manifest import MANIFEST_NAME, ShardEntry
from chute._src.storage.records.shard_files import tail_crc32c

__all__ = ["shard_entry", "write_manifest"]


def array_record_count(path: str | os.PathLike[str]) -> int:
    """The number of records of an ArrayRecord file; `DataError` if it does not open."""
    from chute._src.storage.formats.array_record import ArrayRecordDataSource

    src = ArrayRecordDataSource(os.fspath(path))
    return len(src)


def shard_entry(path: Path, shard_format: str) -> ShardEntry:
    """The manifest entry of the shard at `path`, opened and checked (a truncated or
    corrupt shard raises `DataError` naming it)."""
    if shard_format == "crec":
        from chute._src.storage.records.reader import CrecFile

        f = CrecFile(str(path))
        try:
            return ShardEntry(path.name, f.num_records, f.size, f.trailer_crc())
        finally:
            f.close()
    n = array_record_count(path)
    size = os.path.getsize(path)
    return ShardEntry(path.name, n, size, tail_crc32c(path, size))


def _kind(name: str) -> Format | None:
    try:
        return detect_format(name)
    except ValueError:
        return None


def write_manifest(directory: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Writes the `manifest.json` of a directory of shards, so chute reads it as one dataset.

    The shards are the directory's `.crec` files or its ArrayRecord files (all of one
    format), in name order (zero-padded numbers, `part-00003-of-00016...`, sort right);
    hidden files and files of no data format (`README.md`, `_SUCCESS`) are not part of
    it. Every shard is opened and checked first (a truncated or corrupt one raises
    `chute.DataError` naming it), then the manifest (counts, sizes, checksums) is written
    atomically; nothing else in the directory is created, changed or removed. An existing
    manifest that lists other shards is replaced only with `overwrite=True`; one that is
    not chute's never is. Open the result with `RecordFileDataSource(directory)` or
    `ArrayRecordDataSource(directory)`.

    >>> import tempfile
    >>> from chute.records import RecordWriter
    >>> d = tempfile.mkdtemp()
    >>> for k in range(2):
    ...     with RecordWriter(f"{d}/part-{k}.crec") as w:
    ...         _ = w.write(b"record %d" % k)
    >>> _ = write_manifest(d)
    >>> from chute.sources import RecordFileDataSource
    >>> RecordFileDataSource(d)[1]
    b'record 1'
    """
    d = os.fspath(directory)
    if not os.path.isdir(d):
        raise FileNotFoundError(
            f"write_manifest: {d!r} is not a directory; give the directory holding the shards"
        )
    names = [n for n in outputs.list_names(d) if not n.startswith(".") and n != MANIFEST_NAME]
    kinds = {
        n: k for n in names if (k := _kind(n)) is not None and os.path.isfile(os.path.join(d, n))
    }
    found = sorted({k.value for k in kinds.values()})
    if not kinds:
        raise DataError(
            f"{d}: no shards to list (no .crec or ArrayRecord file among {len(names)} "
            "entries); write the shards first, or give the directory that holds them"
        )
    if len(found) > 1:
        by = {f: [n for n, k in kinds.items() if k.value == f][:3] for f in found}
        shown = "; ".join(f"{f}: {', '.join(ns)}" for f, ns in by.items())
        raise ValueError(
            f"{d} mixes formats ({shown}); a dataset's shards are all .crec or all "
            "ArrayRecord: move the others to a directory of their own"
        )
    fmt = found[0]
    if fmt not in _manifest.SHARD_FORMATS:
        raise ValueError(
            f"{d} holds {fmt} files; a manifest lists .crec or ArrayRecord shards, and "
            f"chute reads {fmt} files directly: give their paths (or a glob), or convert "
            "them with `chute convert`"
        )
    entries = [shard_entry(Path(d, n), fmt) for n in sorted(kinds)]
    path = Path(d, MANIFEST_NAME)
    if os.path.lexists(path):
        _replaceable(path, entries, fmt, overwrite)
    return _manifest.write_manifest(Path(d), entries, fmt)


def _replaceable(path: Path, entries: list[ShardEntry], fmt: str, overwrite: bool) -> None:
    try:
        old_format = _manifest.manifest_shard_format(path)
        old = [e for _, e in _manifest.read_manifest(path, old_format)]
    except DataError as e:
        raise FileExistsError(
            f"{path} exists and is not a chute manifest ({e}); chute will not replace it: "
            "move it away first"
        ) from None
    same = old_format == fmt and [asdict(e) for e in old] == [asdict(e) for e in entries]
    if not same and not overwrite:
        listed = json.dumps([e.name for e in old][:3])
        raise FileExistsError(
            f"{path} exists and lists other shards ({listed}...); pass overwrite=True "
            "(`chute verify --write-manifest --overwrite`) to list the shards there now"
        )
