"""TFRecordDataSource through chute.sources, on files written here by the TFRecord spec."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import crc32c
import pytest

from chute import DataError
from chute.sources import TFRecordDataSource

RECORDS = [b"", b"one", b"\x00" * 300, b"example %d" * 20]


def _masked(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _write(path: Path, records: list[bytes]) -> Path:
    with open(path, "wb") as f:
        for r in records:
            head = struct.pack("<Q", len(r))
            f.write(head + struct.pack("<I", _masked(head)) + r + struct.pack("<I", _masked(r)))
    return path


def test_random_access_and_pickle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "beside")
    src = TFRecordDataSource(_write(tmp_path / "a.tfrecord", RECORDS))
    assert len(src) == 4
    assert [src[i] for i in (3, 0, 2, 1)] == [RECORDS[i] for i in (3, 0, 2, 1)]
    _write(tmp_path / "b.tfrecord", RECORDS[:2])
    many = TFRecordDataSource(str(tmp_path / "*.tfrecord"))
    assert pickle.loads(pickle.dumps(many)).__getitems__([5, 4]) == [b"one", b""]
    assert (tmp_path / ".a.tfrecord.tfrecord.chute-index").exists()


def test_corrupt_data_and_length(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.tfrecord", RECORDS)
    data = bytearray(path.read_bytes())
    pos = data.index(b"one")
    data[pos] ^= 0x20
    path.write_bytes(bytes(data))
    src = TFRecordDataSource(path, cache_index=False)
    with pytest.raises(DataError, match=r"c\.tfrecord: record 1: its data fails its CRC32C"):
        src[1]
    assert TFRecordDataSource(path, verify_checksums=False, cache_index=False)[1] == b"One"
    data[16 + 0] ^= 0x01  # the second record's length
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"c\.tfrecord: record 1: its length fails"):
        len(TFRecordDataSource(path, cache_index=False))
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(DataError, match="record 1"):
        len(TFRecordDataSource(path, cache_index=False))
