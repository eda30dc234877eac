"""`TFRecordIterDataset`: a missing or corrupt file raises where it is read, as in Grain."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import chute
from chute._src.storage.formats.tfrecord import masked_crc32c


def _write(path: Path, records: list[bytes]) -> str:
    with open(path, "wb") as f:
        for r in records:
            head = struct.pack("<Q", len(r))
            f.write(head + struct.pack("<I", masked_crc32c(head)))
            f.write(r + struct.pack("<I", masked_crc32c(r)))
    return str(path)


def test_a_missing_file_raises_when_read(tmp_path: Path) -> None:
    good = _write(tmp_path / "a.tfrecord", [b"x", b"y"])
    ds = chute.experimental.TFRecordIterDataset([good, str(tmp_path / "missing.tfrecord")])
    it = iter(ds)  # built without error
    assert [next(it), next(it)] == [b"x", b"y"]  # the first file, read before the second
    with pytest.raises(FileNotFoundError, match=r"missing\.tfrecord"):
        next(it)


def test_a_corrupt_file_raises_a_value_error_when_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(b"1")
    ds = chute.experimental.TFRecordIterDataset(str(bad))
    with pytest.raises(ValueError, match="ends inside a record header"):
        list(ds)
    with pytest.raises(chute.DataError):
        list(ds)  # each time it is read


def test_readable_files_checkpoint_as_before(tmp_path: Path) -> None:
    paths = [
        _write(tmp_path / f"{i}.tfrecord", [b"%d-%d" % (i, j) for j in range(3)]) for i in (0, 1)
    ]
    ds = chute.experimental.TFRecordIterDataset(paths, cycle_length=2)
    assert list(ds) == [b"0-0", b"1-0", b"0-1", b"1-1", b"0-2", b"1-2"]
    chute.experimental.assert_equal_output_after_checkpoint(ds)
