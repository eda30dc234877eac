"""Which reader a path needs (by its name, else by its first bytes; `--from` overrides),
and its records as bytes."""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from chute._src.core.errors import DataError
from chute._src.storage.records.checksum import crc32c
from chute._src.storage.records.layout import HEADER_MAGIC
from chute._src.storage.records.manifest import MANIFEST_NAME, manifest_shard_format
from chute._src.storage.records.staging import ARRAY_RECORD_MAGIC
from chute._src.storage.remote.urls import StorageOptions, is_url

__all__ = [
    "ARRAY_RECORD_SUFFIXES",
    "Format",
    "as_bytes_source",
    "detect_format",
    "iter_blocks",
    "open_source",
    "sniff_format",
]


class Format(enum.Enum):
    """The file formats `chute convert`, `inspect` and `verify` understand."""

    CREC = "crec"
    JSONL = "jsonl"
    ARRAY_RECORD = "arrayrecord"
    PARQUET = "parquet"
    TFRECORD = "tfrecord"
    NUMPY = "numpy"


_SUFFIXES = {
    ".crec": Format.CREC,
    ".jsonl": Format.JSONL,
    ".ndjson": Format.JSONL,
    ".json": Format.JSONL,
    ".array_record": Format.ARRAY_RECORD,
    ".array-record": Format.ARRAY_RECORD,
    ".arrayrecord": Format.ARRAY_RECORD,
    ".parquet": Format.PARQUET,
    ".pq": Format.PARQUET,
    ".tfrecord": Format.TFRECORD,
    ".tfrecords": Format.TFRECORD,
    ".npy": Format.NUMPY,
}


ARRAY_RECORD_SUFFIXES = tuple(k for k, v in _SUFFIXES.items() if v is Format.ARRAY_RECORD)
_SNIFF = 16  # bytes read to tell a file's format by its first bytes


def _tfrecord_head(head: bytes) -> bool:
    """True if `head` starts with a TFRecord frame: a length and its masked CRC32C."""
    if len(head) < 12:
        return False
    crc = crc32c(head[:8])
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    return masked == struct.unpack_from("<I", head, 8)[0]


def sniff_format(head: bytes) -> Format | None:
    """The format a file's first bytes show, or None if they show none.

    >>> sniff_format(b"CHUTEREC..."), sniff_format(bytes.fromhex("83af70d10d884a3f"))
    (<Format.CREC: 'crec'>, <Format.ARRAY_RECORD: 'arrayrecord'>)
    >>> sniff_format(b'{"a": 1}\\n'), sniff_format(b"hello")
    (<Format.JSONL: 'jsonl'>, None)
    """
    signatures = {
        HEADER_MAGIC: Format.CREC,
        ARRAY_RECORD_MAGIC: Format.ARRAY_RECORD,  # riegeli's file signature
        b"PAR1": Format.PARQUET,
        b"\x93NUMPY": Format.NUMPY,
    }
    for magic, fmt in signatures.items():
        if head.startswith(magic):
            return fmt
    if _tfrecord_head(head):
        return Format.TFRECORD
    if head.lstrip()[:1] in (b"{", b"["):
        return Format.JSONL
    return None


def _head(path: str, storage_options: StorageOptions) -> bytes:
    """The first bytes of the file at `path` (through the readers' opener: URLs too)."""
    from chute._src.storage.formats._open import open_data

    f = open_data(path, "a data file", storage_options, lease=False)
    try:
        return bytes(f.mapping()[:_SNIFF]) if f.size else b""
    finally:
        f.close()


def detect_format(path: str | os.PathLike[str], storage_options: StorageOptions = None) -> Format:
    """The format a path's name implies (TFDS-style `x.tfrecord-00000-of-00010` too), else
    the one its first bytes show (`sniff_format`).

    >>> detect_format("train.array_record-00000-of-00004"), detect_format("a/b.jsonl")
    (<Format.ARRAY_RECORD: 'arrayrecord'>, <Format.JSONL: 'jsonl'>)
    >>> detect_format("train.array-record")
    <Format.ARRAY_RECORD: 'arrayrecord'>
    """
    if is_url(path):
        name = str(path).rstrip("/").rsplit("/", 1)[-1]
        if name == MANIFEST_NAME or "." not in name:  # a dataset prefix (with manifest.json)
            return Format.CREC
    p = Path(path)
    if not is_url(path) and (p.is_dir() or p.name == MANIFEST_NAME):
        if (p / MANIFEST_NAME).exists() or p.name == MANIFEST_NAME:
            manifest = p if p.name == MANIFEST_NAME else p / MANIFEST_NAME
            return Format(manifest_shard_format(manifest)) if manifest.exists() else Format.CREC
        if p.is_dir():
            raise DataError(
                f"{p}: a directory without {MANIFEST_NAME}; give its files (or a glob), "
                "or a .crec dataset directory written by chute"
            )
    name = p.name.lower()
    for suffix, fmt in _SUFFIXES.items():
        if name.endswith(suffix) or f"{suffix}-" in name:
            return fmt
    try:
        found = sniff_format(_head(os.fspath(path), storage_options))
    except (DataError, OSError):
        found = None  # (a missing or unreadable file: its reader names it)
    if found is not None:
        return found
    choices = ", ".join(f.value for f in Format)
    raise ValueError(
        f"cannot tell the format of {str(path)!r} from its name or its first bytes; "
        f"pass --from FORMAT, one of {choices}"
    )


def open_source(
    paths: Sequence[str],
    fmt: Format,
    storage_options: StorageOptions = None,
    *,
    decoded: bool = False,
) -> Any:
    """The chute source reading `paths` as `fmt` (records as that source returns them;
    JSONL lines as bytes unless `decoded`, then as that source's default gives them)."""
    from chute._src.storage.formats import array_record, crec, jsonl, numpy_array, parquet, tfrecord

    so = storage_options
    if fmt is Format.CREC:
        return crec.RecordFileDataSource(list(paths), storage_options=so)
    if fmt is Format.JSONL:
        return jsonl.JsonlDataSource(list(paths), decode=decoded, storage_options=so)
    if fmt is Format.ARRAY_RECORD:
        return array_record.ArrayRecordDataSource(list(paths), storage_options=so)
    if fmt is Format.PARQUET:
        return parquet.ParquetDataSource(list(paths), storage_options=so)
    if fmt is Format.TFRECORD:
        return tfrecord.TFRecordDataSource(list(paths), storage_options=so)
    return numpy_array.NumpyDataSource(list(paths), storage_options=so)


def _json_dumps() -> Any:
    try:
        import orjson

        def dumps(x: Any) -> bytes:
            return orjson.dumps(x, option=orjson.OPT_SERIALIZE_NUMPY)

    except ImportError:  # pragma: no cover - orjson is in the test extra
        import json

        def dumps(x: Any) -> bytes:
            return json.dumps(x).encode()

    return dumps


def as_bytes_source(source: Any, fmt: Format) -> tuple[Any, dict[str, Any]]:
    """Wraps `source` so every record is bytes; returns it and metadata to store."""
    if fmt in (Format.CREC, Format.JSONL, Format.ARRAY_RECORD, Format.TFRECORD):
        return source, {"source_format": fmt.value}
    if fmt is Format.PARQUET:
        return _Mapped(source, _json_record(source)), {
            "source_format": fmt.value,
            "encoding": "json",
        }
    first = np.asarray(source[0]) if len(source) else np.zeros(0)
    meta = {
        "source_format": fmt.value,
        "encoding": "numpy",
        "numpy": {"dtype": first.dtype.str, "shape": list(first.shape)},
    }
    return _Mapped(source, lambda i, row: np.ascontiguousarray(row).tobytes()), meta


def _json_record(source: Any) -> Any:
    dumps = _json_dumps()

    def encode(i: int, row: Any) -> bytes:
        try:
            return bytes(dumps(row))
        except TypeError as e:
            raise DataError(
                f"{source!r}: row {i} cannot be stored as JSON ({e}); binary columns need "
                "a conversion of your own: write them with chute.records.RecordWriter"
            ) from None

    return encode


class _Mapped:
    def __init__(self, source: Any, fn: Any) -> None:
        self._source = source
        self._fn = fn

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, i: int) -> bytes:
        return bytes(self._fn(i, self._source[i]))

    def __getitems__(self, indices: Sequence[int]) -> list[bytes]:
        rows = self._source.__getitems__(indices)
        return [bytes(self._fn(i, r)) for i, r in zip(indices, rows)]


def iter_blocks(source: Any, block: int = 1024, start: int = 0) -> Iterator[list[Any]]:
    """The records of `source` from `start` on, `block` at a time (via `__getitems__`)."""
    n = len(source)
    getitems = getattr(source, "__getitems__", None)
    for lo in range(start, n, block):
        idx = list(range(lo, min(lo + block, n)))
        yield getitems(idx) if getitems is not None else [source[i] for i in idx]
