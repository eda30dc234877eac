"""A script that reads local files through chute's sources and ends without closing
anything exits quietly: nothing on stderr, status 0, whenever its sources are collected
(while the script's globals are cleared, or only after chute's own modules are torn
down)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from chute.records import RecordWriter
from process_helpers import run_python

READ_ALL = """
import sys
import chute
from chute.sources import (
    ArrayRecordDataSource, JsonlDataSource, NumpyDataSource, RecordFileDataSource,
    TFRecordDataSource,
)

sources = [
    JsonlDataSource("d.jsonl"),
    TFRecordDataSource("d.tfrecord"),
    ArrayRecordDataSource("d.array_record"),
    RecordFileDataSource("d.crec"),
    NumpyDataSource("d.npy"),
]
print([len(s) for s in sources], [type(s[1]).__name__ for s in sources])
ds = chute.MapDataset.source(JsonlDataSource("d.jsonl")).shuffle(seed=3).batch(4)
it = iter(ds.to_iter_dataset(read_options=chute.ReadOptions(num_threads=2, prefetch_buffer_size=4)))
print(next(it)["i"])  # abandoned mid-epoch
"""

KEEP = {
    "globals": "",
    # Held by `sys`, the sources outlive the teardown of every chute module.
    "until_modules_are_gone": "sys._chute_kept = (sources, ds, it)\n",
}


def _tfrecord(path: Path, records: list[bytes]) -> None:
    import crc32c

    def masked(data: bytes) -> int:
        crc = crc32c.crc32c(data)
        return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    with open(path, "wb") as f:
        for r in records:
            head = struct.pack("<Q", len(r))
            f.write(head + struct.pack("<I", masked(head)) + r + struct.pack("<I", masked(r)))


def _write_files(folder: Path) -> None:
    from array_record.python import array_record_module

    rows = [json.dumps({"i": i}).encode() for i in range(20)]
    (folder / "d.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    _tfrecord(folder / "d.tfrecord", rows)
    w = array_record_module.ArrayRecordWriter(str(folder / "d.array_record"), "group_size:1")
    for r in rows:
        w.write(r)
    w.close()
    with RecordWriter(folder / "d.crec") as rw:
        for r in rows:
            rw.write(r)
    np.save(folder / "d.npy", np.arange(40).reshape(20, 2))


@pytest.mark.parametrize("keep", sorted(KEEP))
def test_reading_local_files_then_exiting_prints_nothing(tmp_path: Path, keep: str) -> None:
    _write_files(tmp_path)
    (tmp_path / "script.py").write_text(READ_ALL + KEEP[keep])
    done = run_python(tmp_path, ["script.py"], cwd=tmp_path, timeout=60)
    assert (
        done.stdout.splitlines()[0]
        == "[20, 20, 20, 20, 20] ['dict', 'bytes', 'bytes', 'bytes', 'ndarray']"
    )
    assert done.stderr == ""
