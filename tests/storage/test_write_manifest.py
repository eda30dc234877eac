"""write_manifest / `chute verify --write-manifest`: shards written by any engine (here
other processes) become a chute dataset; bad directories get clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import chute.cli
from chute import DataError
from chute.records import RecordWriter, write_manifest
from chute.sources import ArrayRecordDataSource, RecordFileDataSource

_WRITE_CREC = """
import sys
from chute.records import RecordWriter
path, k = sys.argv[1], int(sys.argv[2])
with RecordWriter(path) as w:
    for i in range(100):
        w.write(b"shard %d record %d" % (k, i))
"""


def _crec_shards_by_other_processes(d: Path, n: int = 3) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITE_CREC, str(d / f"part-{k:05d}.crec"), str(k)], env=env
        )
        for k in range(n)
    ]
    assert [p.wait() for p in procs] == [0] * n


def _array_record(path: Path, records: list[bytes]) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    w = ArrayRecordWriter(str(path), "group_size:1")
    for r in records:
        w.write(r)
    w.close()


def test_crec_shards_written_by_other_processes_become_a_dataset(tmp_path: Path) -> None:
    _crec_shards_by_other_processes(tmp_path)
    (tmp_path / "README.md").write_text("notes\n")
    (tmp_path / "_SUCCESS").write_text("")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(DataError, match=r"no manifest.json"):
        RecordFileDataSource(str(tmp_path))
    path = write_manifest(tmp_path)
    assert path == tmp_path / "manifest.json"
    src = RecordFileDataSource(str(tmp_path))
    assert len(src) == 300
    assert src[0] == b"shard 0 record 0" and src[299] == b"shard 2 record 99"
    # Nothing but the manifest was added; no file was changed.
    assert {
        p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != "manifest.json"
    } == before
    assert write_manifest(tmp_path) == path  # the same shards: the same manifest


def test_array_record_shards_and_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for k in range(2):
        _array_record(
            tmp_path / f"data.array_record-{k:05d}-of-00002", [b"%d-%d" % (k, i) for i in range(50)]
        )
    assert chute.cli.main(["verify", "--write-manifest", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "manifest.json" in out and "OK: 100 records" in out
    doc = json.loads((tmp_path / "manifest.json").read_text())
    assert doc["shard_format"] == "arrayrecord" and doc["num_records"] == 100
    src = ArrayRecordDataSource(str(tmp_path))
    assert src[0] == b"0-0" and src[99] == b"1-49"
    with pytest.raises(DataError, match=r"lists arrayrecord shards.*ArrayRecordDataSource"):
        RecordFileDataSource(str(tmp_path))
    # A shard replaced after the manifest was written is refused by name.
    _array_record(tmp_path / "data.array_record-00001-of-00002", [b"other"] * 50)
    with pytest.raises(
        DataError, match=r"00001-of-00002: the shard is not the file the manifest lists"
    ):
        ArrayRecordDataSource(str(tmp_path))


def test_mixed_formats_are_refused(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "a.crec") as w:
        w.write(b"x")
    _array_record(tmp_path / "b.array_record", [b"y"])
    with pytest.raises(
        ValueError, match=r"mixes formats \(arrayrecord: b.array_record; crec: a.crec\)"
    ):
        write_manifest(tmp_path)
    assert not (tmp_path / "manifest.json").exists()


def test_a_truncated_shard_is_named(tmp_path: Path) -> None:
    _crec_shards_by_other_processes(tmp_path, 2)
    bad = tmp_path / "part-00001.crec"
    os.truncate(bad, bad.stat().st_size - 10)
    with pytest.raises(DataError, match=r"part-00001.crec.*truncated"):
        write_manifest(tmp_path)
    assert not (tmp_path / "manifest.json").exists()
    assert chute.cli.main(["verify", "--write-manifest", str(tmp_path)]) == 1


def test_other_files_and_manifests_are_never_replaced(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"not a directory"):
        write_manifest(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"no shards to list"):
        write_manifest(tmp_path)
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(
        ValueError, match=r"holds jsonl files; a manifest lists .crec or ArrayRecord"
    ):
        write_manifest(tmp_path)
    (tmp_path / "rows.jsonl").unlink()
    _crec_shards_by_other_processes(tmp_path, 1)
    (tmp_path / "manifest.json").write_text('{"mine": true}')
    with pytest.raises(FileExistsError, match=r"not a chute manifest.*will not replace it"):
        write_manifest(tmp_path)
    assert (tmp_path / "manifest.json").read_text() == '{"mine": true}'
    (tmp_path / "manifest.json").unlink()
    write_manifest(tmp_path)
    with RecordWriter(tmp_path / "part-00001.crec") as w:
        w.write(b"new")
    with pytest.raises(FileExistsError, match=r"lists other shards.*overwrite=True"):
        write_manifest(tmp_path)
    write_manifest(tmp_path, overwrite=True)
    assert len(RecordFileDataSource(str(tmp_path))) == 101
