"""The `chute` command line, through chute.cli.main and one real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from chute.cli import main
from chute.sources import RecordFileDataSource


@pytest.fixture
def jsonl(tmp_path: Path, corpus_records: list[bytes]) -> tuple[Path, list[bytes]]:
    records = corpus_records[:500]
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(records) + b"\n")
    return path, records


@pytest.mark.parametrize("compress", ["none", "zstd", "zstd-dict"])
def test_convert_jsonl_to_crec(
    tmp_path: Path,
    jsonl: tuple[Path, list[bytes]],
    compress: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, records = jsonl
    out = tmp_path / "out.crec"
    assert main(["convert", str(path), str(out), "--compress", compress]) == 0
    assert "wrote 500 records" in capsys.readouterr().out
    src = RecordFileDataSource(out)
    assert [src[i] for i in range(len(src))] == records
    assert src.metadata == {"source_format": "jsonl"}


def test_convert_sharded_inspect_verify(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, records = jsonl
    out = tmp_path / "ds"
    assert main(["convert", str(path), str(out), "--shards", "3", "--compress", "zstd"]) == 0
    assert len(list(out.glob("*.crec"))) == 3
    assert RecordFileDataSource(out).__getitems__([499, 0]) == [records[499], records[0]]
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "format:   crec" in shown and "records:  500" in shown and "files:    3" in shown
    assert "[0] b'{" in shown
    assert main(["verify", str(out)]) == 0
    assert "OK: 500 records" in capsys.readouterr().out
    assert main(["convert", str(path), str(out)]) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["convert", str(path), str(out), "--overwrite", "--shards", "2"]) == 0
    assert len(RecordFileDataSource(out).paths) == 2


def test_verify_reports_the_first_bad_record(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, records = jsonl
    out = tmp_path / "out.crec"
    main(["convert", str(path), str(out)])
    data = bytearray(out.read_bytes())
    pos = data.index(records[123])
    data[pos + 10] ^= 0x04
    out.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    assert "FAILED: " in (text := capsys.readouterr().out)
    assert "record 123: the payload fails its CRC32C check" in text


def test_convert_other_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": i, "text": f"t{i}"} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=16)
    assert main(["convert", str(tmp_path / "a.parquet"), str(tmp_path / "p.crec")]) == 0
    src = RecordFileDataSource(tmp_path / "p.crec")
    assert [json.loads(src[i]) for i in range(40)] == rows

    arr = np.arange(60, dtype=np.float32).reshape(20, 3)
    np.save(tmp_path / "x.npy", arr)
    assert main(["convert", str(tmp_path / "x.npy"), str(tmp_path / "n.crec")]) == 0
    src = RecordFileDataSource(tmp_path / "n.crec")
    meta = src.metadata["numpy"]
    assert meta == {"dtype": "<f4", "shape": [3]}
    np.testing.assert_array_equal(np.frombuffer(src[7], dtype=meta["dtype"]), arr[7])

    (tmp_path / "lines.txt").write_bytes(b'"a"\n"b"\n')  # neither its name nor bytes tell
    assert main(["convert", str(tmp_path / "lines.txt"), str(tmp_path / "l.crec")]) == 1
    assert "pass --from FORMAT" in capsys.readouterr().err
    args = ["convert", "--from", "jsonl", str(tmp_path / "lines.txt"), str(tmp_path / "l.crec")]
    assert main(args) == 0
    assert RecordFileDataSource(tmp_path / "l.crec")[1] == b'"b"'
    (tmp_path / "objects.txt").write_bytes(b'{"a": 1}\n{"a": 2}\n')  # JSON objects: JSONL
    assert main(["convert", str(tmp_path / "objects.txt"), str(tmp_path / "o.crec")]) == 0
    assert RecordFileDataSource(tmp_path / "o.crec")[1] == b'{"a": 2}'


def test_to_and_from_array_record(tmp_path: Path, jsonl: tuple[Path, list[bytes]]) -> None:
    from chute.sources import ArrayRecordDataSource

    path, records = jsonl
    ar = tmp_path / "c.array_record"
    assert main(["convert", str(path), str(ar)]) == 0
    assert ArrayRecordDataSource(str(ar)).__getitems__(list(range(500))) == records
    assert main(["convert", str(ar), str(tmp_path / "back.crec")]) == 0
    assert RecordFileDataSource(tmp_path / "back.crec")[42] == records[42]
    shards = tmp_path / "ars"
    assert main(["convert", str(path), str(shards), "--to", "arrayrecord", "--shards", "2"]) == 0
    parts = sorted(str(p) for p in shards.glob("*.array_record"))
    assert [Path(p).name for p in parts] == [
        "part-00000-of-00002.array_record",
        "part-00001-of-00002.array_record",
    ]
    assert ArrayRecordDataSource(parts)[499] == records[499]


def test_tfrecord_convert_and_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import struct

    import crc32c

    def masked(b: bytes) -> int:
        c = crc32c.crc32c(b)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    records = [b"example-%d" % i for i in range(30)]
    with open(tmp_path / "a.tfrecord", "wb") as f:
        for r in records:
            h = struct.pack("<Q", len(r))
            f.write(h + struct.pack("<I", masked(h)) + r + struct.pack("<I", masked(r)))
    assert main(["verify", str(tmp_path / "a.tfrecord")]) == 0
    assert main(["convert", str(tmp_path / "a.tfrecord"), str(tmp_path / "t.crec")]) == 0
    assert RecordFileDataSource(tmp_path / "t.crec")[29] == records[29]


def test_command_line_entry_point(tmp_path: Path, jsonl: tuple[Path, list[bytes]]) -> None:
    path, _ = jsonl
    out = tmp_path / "o.crec"
    cmd = [sys.executable, "-m", "chute.cli", "convert", str(path), str(out), "--progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "convert: 500/500 records 100%" in proc.stderr
    assert "MB/s" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "chute.cli", "inspect", str(tmp_path / "missing.crec")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and "no such file" in proc.stderr


def test_resume_keeps_complete_shards_of_the_same_job(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    path, records = jsonl
    out = tmp_path / "ds"
    args = ["convert", str(path), str(out), "--shards", "4", "--compress", "zstd-dict"]
    assert main(args) == 0
    # What a run killed while writing shard 2 leaves: shards 0 and 1, a partial, no manifest.
    (out / "manifest.json").unlink()
    (out / "part-00002-of-00004.crec").rename(out / ".part-00002-of-00004.crec.1234abcd.partial")
    (out / "part-00003-of-00004.crec").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.crec")}
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert "resumed: kept 250 records" in capsys.readouterr().out
    assert {p: (out / p).stat().st_mtime_ns for p in kept} == kept
    assert not list(out.glob(".*.partial"))
    src = RecordFileDataSource(out)
    assert [src[i] for i in range(len(src))] == records
    # A changed input is another job: nothing is kept.
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (out / "manifest.json").unlink()
    assert main([*args, "--resume"]) == 0
    assert "resumed" not in capsys.readouterr().out
    assert main(["convert", str(path), str(tmp_path / "one.crec"), "--resume"]) == 1
    assert "--resume works for sharded" in capsys.readouterr().err


def test_overwrite_reports_only_the_bytes_chute_wrote(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, records = jsonl
    out = tmp_path / "ds"
    assert main(["convert", str(path), str(out), "--shards", "2"]) == 0
    (out / "big-notes.bin").write_bytes(bytes(1 << 20))
    capsys.readouterr()
    assert main(["convert", str(path), str(out), "--shards", "3", "--overwrite"]) == 0
    doc = json.loads((out / "manifest.json").read_bytes())
    written = sum(s["size"] for s in doc["shards"]) + (out / "manifest.json").stat().st_size
    assert f"{written:,} bytes out" in capsys.readouterr().out
    assert (out / "big-notes.bin").stat().st_size == 1 << 20
    src = RecordFileDataSource(out)
    assert [src[i] for i in range(len(src))] == records


def test_overlap_is_refused_in_process_too(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = jsonl
    out = tmp_path / "ds"
    assert main(["convert", str(path), str(out), "--shards", "2"]) == 0
    capsys.readouterr()
    assert main(["convert", str(out), str(out), "--shards", "4", "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("chute convert: error: the output overlaps the inputs")
    assert len(RecordFileDataSource(out)) == 500


# What `inspect` and `verify` take: every ArrayRecord name, files no name tells, directories
# and globs of every format; each error printed once, with its fix.


def _inspected(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, str]:
    """The `name: value` lines `chute inspect` printed."""
    capsys.readouterr()
    assert main(["inspect", *args, "--show", "1"]) == 0
    out = capsys.readouterr().out
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in out.splitlines())}


@pytest.mark.parametrize(
    "name", ["train.array-record", "train.array_record", "train.arrayrecord", "train", "t.bin"]
)
def test_array_record_is_known_by_each_of_its_names_and_by_its_first_bytes(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = jsonl
    written = tmp_path / "train.array-record"
    assert main(["convert", str(path), str(written)]) == 0
    assert written.is_file()  # one file, as the name asks, not a directory
    target = tmp_path / name
    if target != written:
        written.rename(target)
    shown = _inspected(capsys, str(target))
    assert shown["format"] == "arrayrecord" and shown["records"] == "500"
    assert shown["size"] == f"{target.stat().st_size:,} bytes on disk"
    assert main(["verify", str(target)]) == 0
    assert "OK: 500 records" in capsys.readouterr().out


def _tfrecord(path: Path, records: list[bytes]) -> None:
    import struct

    import crc32c

    def masked(b: bytes) -> int:
        c = crc32c.crc32c(b)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    with open(path, "wb") as f:
        for r in records:
            h = struct.pack("<Q", len(r))
            f.write(h + struct.pack("<I", masked(h)) + r + struct.pack("<I", masked(r)))


def _two_files(folder: Path, fmt: str, records: list[bytes]) -> None:
    """`records` split over two files of `fmt` in `folder`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    for k, part in enumerate((records[:200], records[200:])):
        if fmt == "jsonl":
            (folder / f"{k}.jsonl").write_bytes(b"\n".join(part) + b"\n")
        elif fmt == "tfrecord":
            _tfrecord(folder / f"{k}.tfrecord", part)
        elif fmt == "parquet":
            rows = [{"line": r.decode()} for r in part]
            pq.write_table(pa.Table.from_pylist(rows), folder / f"{k}.parquet")
        else:
            np.save(folder / f"{k}.npy", np.arange(len(part) * 2).reshape(len(part), 2))


@pytest.mark.parametrize(
    "fmt", ["jsonl", "tfrecord", "parquet", "numpy", "arrayrecord-shards", "crec-shards"]
)
def test_inspect_and_verify_take_directories_and_globs_with_true_counts_and_sizes(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]], fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, records = jsonl
    folder = tmp_path / "data"
    if fmt.endswith("-shards"):  # a dataset directory chute convert wrote
        to = fmt.split("-")[0]
        assert main(["convert", str(path), str(folder), "--to", to, "--shards", "4"]) == 0
    else:
        _two_files(folder, fmt, records)
    data = sorted(p for p in folder.iterdir() if p.name != "manifest.json")
    size = f"{sum(p.stat().st_size for p in data):,} bytes on disk"
    for arg in (str(folder), str(folder / "*")):
        shown = _inspected(capsys, arg)
        assert shown["format"] == fmt.split("-")[0]
        assert shown["files"] == str(len(data)) and shown["records"] == "500"
        assert shown["size"].startswith(size)
        assert main(["verify", arg, "--no-progress"]) == 0
        assert "OK: 500 records" in capsys.readouterr().out


def test_inspect_reads_files_at_urls_through_the_same_opener(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    fsspec = pytest.importorskip("fsspec")
    path, _ = jsonl
    ar = tmp_path / "c.array_record"
    assert main(["convert", str(path), str(ar)]) == 0
    fs = fsspec.filesystem("memory")
    root = f"/cli-{tmp_path.name}"
    fs.pipe(f"{root}/j/0.jsonl", path.read_bytes())
    fs.pipe(f"{root}/j/1.jsonl", path.read_bytes())
    fs.pipe(f"{root}/train.bin", ar.read_bytes())  # no name tells: its first bytes do
    try:
        shown = _inspected(capsys, f"memory://{root}/j/*.jsonl")
        assert shown["files"] == "2" and shown["records"] == "1,000"
        assert shown["size"] == f"{2 * path.stat().st_size:,} bytes on disk"
        shown = _inspected(capsys, f"memory://{root}/train.bin")
        assert shown["format"] == "arrayrecord" and shown["records"] == "500"
        assert shown["size"] == f"{ar.stat().st_size:,} bytes on disk"
    finally:
        fs.rm(root, recursive=True)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chute.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        timeout=120,
    )


def test_each_error_is_printed_once_with_its_fix(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, _ = jsonl
    (tmp_path / "notes.txt").write_bytes(b"hello\n")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a.jsonl").write_bytes(path.read_bytes())
    np.save(mixed / "b.npy", np.arange(4))
    (tmp_path / "empty").mkdir()
    cases = {
        ("convert", "missing.jsonl", "out.crec"): (
            "chute convert: error: 'missing.jsonl': no such file or directory; check the path"
        ),
        ("inspect", "missing"): "chute inspect: error: 'missing': no such file or directory",
        ("verify", "nomatch*"): "chute verify: error: 'nomatch*': the pattern matches no file",
        ("inspect", "notes.txt"): (
            "chute inspect: error: cannot tell the format of 'notes.txt' from its name or its "
            "first bytes; pass --from FORMAT, one of crec, jsonl, arrayrecord"
        ),
        ("verify", "mixed"): (
            "chute verify: error: the files mix formats (jsonl: mixed/a.jsonl; numpy: "
            "mixed/b.npy); give the files of one format"
        ),
        ("inspect", "empty"): "chute inspect: error: empty: the directory holds no data files",
    }
    for args, first in cases.items():
        done = _cli(*args, cwd=tmp_path)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.startswith(first), (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.count(f"chute {args[0]}:") == 1, done.stderr
        assert "--to" not in done.stderr and "Traceback" not in done.stderr
        assert "FAILED" not in done.stdout


def test_a_reader_that_stops_early_ends_inspect_quietly(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(b'{"i": %d, "t": "%s"}\n' % (i, b"y" * 50) for i in range(20_000)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "chute.cli", "inspect", str(path), "--show", "20000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == "format:   jsonl\n"
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 1
    assert err == ""
