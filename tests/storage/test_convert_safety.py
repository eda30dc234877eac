"""`chute convert` never loses data: not its inputs, not files it did not write, not the
old dataset when a replacement is interrupted. Every case runs the real command line in
a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import chute
from chute.sources import RecordFileDataSource

SRC = str(Path(chute.__file__).resolve().parents[1])


def chute_cli(*args: object, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chute.cli", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": SRC},
        cwd=cwd,
    )


def ok(*args: str | Path) -> None:
    proc = chute_cli(*args)
    assert proc.returncode == 0, proc.stderr


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (None) under `root`, by relative path."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


def records_of(path: Path) -> list[bytes]:
    src = RecordFileDataSource(path)
    try:
        return src.__getitems__(list(range(len(src))))
    finally:
        src.close()


def listed(ds: Path) -> set[str]:
    doc = json.loads((ds / "manifest.json").read_bytes())
    return {s["name"] for s in doc["shards"]}


@pytest.fixture
def jsonl(tmp_path: Path) -> tuple[Path, list[bytes]]:
    records = [b'{"id": %d, "text": "%s"}' % (i, b"w" * (i % 37)) for i in range(300)]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(records) + b"\n")
    return path, records


# -- inputs and output overlap ------------------------------------------------------------


def test_converting_a_dataset_onto_itself_is_refused_and_keeps_it(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, records = jsonl
    ds = tmp_path / "ds"
    ok("convert", path, ds, "--shards", "2")
    before = snapshot(tmp_path)
    (tmp_path / "link").symlink_to(ds)
    for args in (
        ["convert", ds, ds, "--shards", "4", "--overwrite"],
        ["convert", str(ds / "*.crec"), ds, "--overwrite"],
        ["convert", ds / "manifest.json", ds, "--shards", "4", "--overwrite"],
        ["convert", tmp_path / "link", ds, "--shards", "4", "--overwrite"],
        ["convert", ds, tmp_path / "link", "--shards", "4", "--overwrite"],
        ["convert", ds, ds / "inner", "--shards", "4"],
    ):
        proc = chute_cli(*args)
        assert proc.returncode == 1, args
        assert "the output overlaps the inputs" in proc.stderr, proc.stderr
        assert str(ds) in proc.stderr and "never writes where it reads" in proc.stderr
        assert ".new" in proc.stderr  # the fix: write elsewhere, then swap
    (tmp_path / "link").unlink()
    assert snapshot(tmp_path) == before
    assert records_of(ds) == records


def test_an_output_holding_or_being_an_input_file_is_refused(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, _ = jsonl
    one = tmp_path / "one.crec"
    ok("convert", path, one)
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.jsonl").write_bytes(path.read_bytes())
    os.link(one, tmp_path / "hard.crec")
    before = snapshot(tmp_path)
    for args, says in (
        (["convert", one, one, "--overwrite"], "is the output"),
        (["convert", out / "a.jsonl", out, "--shards", "2", "--overwrite"], "inside the output"),
        (["convert", str(out / "*.jsonl"), out, "--overwrite"], "inside the output"),
        (["convert", one, tmp_path / "hard.crec", "--overwrite"], "hard link"),
    ):
        proc = chute_cli(*args)
        assert proc.returncode == 1 and says in proc.stderr, (args, proc.stderr)
    assert snapshot(tmp_path) == before


# -- --overwrite removes only what the manifest lists --------------------------------------


def test_overwrite_removes_only_the_old_shards(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, records = jsonl
    ds = tmp_path / "ds"
    ok("convert", path, ds, "--shards", "2")
    old = listed(ds)
    (ds / "README.md").write_text("my notes\n")
    (ds / "scripts").mkdir()
    (ds / "scripts" / "make.sh").write_text("echo hi\n")
    (ds / "scripts" / "part-00000.crec").write_bytes((ds / sorted(old)[0]).read_bytes())
    mine = {k: v for k, v in snapshot(ds).items() if k.startswith(("README", "scripts"))}
    proc = chute_cli("convert", path, ds, "--shards", "3")
    assert proc.returncode == 1 and "exists; pass --overwrite" in proc.stderr
    ok("convert", path, ds, "--shards", "3", "--overwrite")
    new = listed(ds)
    assert len(new) == 3 and not new & old
    after = snapshot(ds)
    assert {k: v for k, v in after.items() if k.startswith(("README", "scripts"))} == mine
    assert set(after) == set(mine) | new | {"manifest.json"}
    assert records_of(ds) == records
    # and once more: the names alternate, the user's files stay
    ok("convert", path, ds, "--shards", "2", "--overwrite", "--compress", "zstd")
    assert set(snapshot(ds)) == set(mine) | listed(ds) | {"manifest.json"}
    assert records_of(ds) == records


def test_a_shard_replaced_by_a_user_file_is_not_removed(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, records = jsonl
    ds = tmp_path / "ds"
    ok("convert", path, ds, "--shards", "2")
    name = sorted(listed(ds))[1]
    (ds / name).write_bytes(b"the user's own file now")
    ok("convert", path, ds, "--shards", "2", "--overwrite")
    assert (ds / name).read_bytes() == b"the user's own file now"
    assert records_of(ds) == records


def test_a_folder_without_a_manifest_is_written_beside_never_deleted(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, records = jsonl
    folder = tmp_path / "folder"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "backup.crec").mkdir()
    (folder / "backup.crec" / "data").write_bytes(b"precious")
    (folder / "part-00000.crec").write_bytes(b"not chute's")
    (folder / "notes.txt").write_text("keep\n")
    before = snapshot(folder)
    proc = chute_cli("convert", path, folder, "--shards", "2")
    assert proc.returncode == 1
    assert "holds files but no chute manifest" in proc.stderr and "backup.crec" in proc.stderr
    assert "--overwrite to write the dataset beside them" in proc.stderr
    ok("convert", path, folder, "--shards", "2", "--overwrite")
    after = snapshot(folder)
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == listed(folder) | {"manifest.json"}
    assert "part-00000.crec" not in listed(folder)
    assert records_of(folder) == records
    # A directory named like a single-file output is never replaced either.
    proc = chute_cli("convert", path, folder / "backup.crec", "--overwrite")
    assert proc.returncode == 1 and "is a directory" in proc.stderr
    assert (folder / "backup.crec" / "data").read_bytes() == b"precious"


def test_a_manifest_that_is_not_chutes_is_refused(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, _ = jsonl
    site = tmp_path / "site"
    site.mkdir()
    (site / "manifest.json").write_text('{"name": "my web app", "icons": []}\n')
    (site / "index.html").write_text("<html></html>\n")
    before = snapshot(site)
    proc = chute_cli("convert", path, site, "--shards", "2", "--overwrite")
    assert proc.returncode == 1
    assert "is not a chute manifest" in proc.stderr and "another directory" in proc.stderr
    assert snapshot(site) == before


def test_array_record_shards_are_never_replaced(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    pytest.importorskip("array_record")
    path, _ = jsonl
    out = tmp_path / "ars"
    ok("convert", path, out, "--to", "arrayrecord", "--shards", "2")
    before = snapshot(out)
    proc = chute_cli("convert", path, out, "--to", "arrayrecord", "--shards", "3", "--overwrite")
    assert proc.returncode == 1 and "writes no manifest for ArrayRecord" in proc.stderr
    assert snapshot(out) == before


# -- interrupted replacements --------------------------------------------------------------


def _big_input(path: Path, n: int) -> list[bytes]:
    records = [b'{"id": %d, "text": "%s"}' % (i, b"abcdefgh" * (i % 40)) for i in range(n)]
    path.write_bytes(b"\n".join(records) + b"\n")
    return records


def _new_shard(ds: Path, old: set[str]) -> bool:
    if not ds.is_dir():
        return False
    names = {p.name for p in ds.iterdir()} - old
    return any(n.endswith(".crec") and not n.startswith(".") for n in names)


def _kill_midway(args: list[str | Path], ds: Path, old: set[str]) -> bool:
    """Runs `chute convert ARGS` and SIGKILLs it once it has written a new shard; returns
    False if it finished first."""
    return _kill_when(args, lambda: _new_shard(ds, old))


def _kill_when(args: list[str | Path], ready: Callable[[], bool]) -> bool:
    proc = subprocess.Popen(
        [sys.executable, "-m", "chute.cli", "convert", *map(str, args)],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while proc.poll() is None:
            if ready():
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
    except BaseException:
        proc.kill()
        raise
    finally:
        proc.wait()
    return proc.returncode == -signal.SIGKILL


def test_a_killed_overwrite_leaves_the_old_dataset(tmp_path: Path) -> None:
    small = tmp_path / "small.jsonl"
    old_records = _big_input(small, 100)
    ds = tmp_path / "ds"
    ok("convert", small, ds, "--shards", "2")
    (ds / "README.md").write_text("mine\n")
    before = snapshot(ds)
    big = tmp_path / "big.jsonl"
    for n in (60_000, 240_000, 960_000):
        records = _big_input(big, n)
        args: list[str | Path] = [big, ds, "--shards", "8", "--overwrite", "--compress", "zstd"]
        if _kill_midway(args, ds, set(before)):
            break
    else:
        pytest.fail("chute convert finished before it could be killed, even on 960k records")
    after = snapshot(ds)
    assert {k: after[k] for k in before} == before  # the old dataset, byte for byte
    assert records_of(ds) == old_records
    assert listed(ds) == {n for n in before if n.endswith(".crec")}
    leftovers = set(after) - set(before)
    assert leftovers  # shards of the killed run, its journal, maybe a temporary file
    # A later run that does not resume removes every leftover it can prove is its own.
    ok("convert", big, ds, "--shards", "8", "--overwrite", "--compress", "zstd")
    assert set(snapshot(ds)) == listed(ds) | {"manifest.json", "README.md"}
    assert (ds / "README.md").read_text() == "mine\n"
    src = RecordFileDataSource(ds)
    assert len(src) == len(records) and src[len(records) - 1] == records[-1]
    src.close()


def test_a_killed_overwrite_can_resume(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    small = tmp_path / "small.jsonl"
    _big_input(small, 50)
    ok("convert", small, ds, "--shards", "2")
    before = set(snapshot(ds))
    big = tmp_path / "big.jsonl"
    for n in (60_000, 240_000, 960_000):
        records = _big_input(big, n)
        args: list[str | Path] = [big, ds, "--shards", "8", "--overwrite"]
        if _kill_midway(args, ds, before):
            break
    else:
        pytest.fail("chute convert finished before it could be killed, even on 960k records")
    proc = chute_cli("convert", big, ds, "--shards", "8", "--resume")
    assert proc.returncode == 1 and "exists; pass --overwrite" in proc.stderr
    proc = chute_cli("convert", big, ds, "--shards", "8", "--overwrite", "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "resumed: kept" in proc.stdout
    assert set(snapshot(ds)) == listed(ds) | {"manifest.json"}
    assert records_of(ds) == records


def test_a_bad_record_near_the_end_leaves_the_old_dataset(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, records = jsonl
    ds = tmp_path / "ds"
    ok("convert", path, ds, "--shards", "2")
    before = snapshot(ds)
    bad = tmp_path / "bad.crec"
    ok("convert", path, bad)
    data = bytearray(bad.read_bytes())
    data[data.index(records[290]) + 5] ^= 0x01
    bad.write_bytes(bytes(data))
    for shards in ("4", "1"):
        proc = chute_cli("convert", bad, ds, "--shards", shards, "--overwrite")
        assert proc.returncode == 1 and "record 290" in proc.stderr, proc.stderr
        assert snapshot(ds) == before  # nothing added, nothing changed
    assert records_of(ds) == records
    one = tmp_path / "one.crec"
    ok("convert", path, one)
    kept = one.read_bytes()
    proc = chute_cli("convert", bad, one, "--overwrite")
    assert proc.returncode == 1
    assert one.read_bytes() == kept
    names = {p.name for p in tmp_path.iterdir() if not p.name.endswith(".chute-index")}
    assert names == {"bad.crec", "ds", "in.jsonl", "one.crec"}


def test_a_killed_single_file_convert_keeps_the_old_file_and_is_cleaned_up(
    tmp_path: Path,
) -> None:
    small = tmp_path / "small.jsonl"
    old_records = _big_input(small, 100)
    one = tmp_path / "one.crec"
    ok("convert", small, one)
    kept = one.read_bytes()
    # Not chute's: the right name pattern but not its magic bytes.
    decoy = tmp_path / ".one.crec.0123abcd.partial"
    decoy.write_bytes(b"a user's file")

    def temp_has_data() -> bool:
        return any(p.stat().st_size > 1 << 20 for p in tmp_path.glob(".one.crec.*.partial"))

    big = tmp_path / "big.jsonl"
    for n in (60_000, 240_000, 960_000):
        records = _big_input(big, n)
        if _kill_when([big, one, "--overwrite"], temp_has_data):
            break
    else:
        pytest.fail("chute convert finished before it could be killed, even on 960k records")
    assert one.read_bytes() == kept and records_of(one) == old_records
    assert len(list(tmp_path.glob(".one.crec.*.partial"))) == 2
    ok("convert", big, one, "--overwrite")
    assert [p.name for p in tmp_path.glob(".one.crec.*.partial")] == [decoy.name]
    src = RecordFileDataSource(one)
    assert len(src) == len(records)
    src.close()


def test_a_killed_first_convert_says_how_to_go_on(tmp_path: Path) -> None:
    ds = tmp_path / "ds"
    big = tmp_path / "big.jsonl"
    for n in (60_000, 240_000, 960_000):
        records = _big_input(big, n)
        if _kill_midway([big, ds, "--shards", "8"], ds, set()):
            break
    else:
        pytest.fail("chute convert finished before it could be killed, even on 960k records")
    proc = chute_cli("convert", big, ds, "--shards", "8")
    assert proc.returncode == 1 and "interrupted chute convert" in proc.stderr
    assert "--resume" in proc.stderr
    proc = chute_cli("convert", big, ds, "--shards", "8", "--resume")
    assert proc.returncode == 0 and "resumed: kept" in proc.stdout, proc.stderr
    assert set(snapshot(ds)) == listed(ds) | {"manifest.json"}
    assert records_of(ds) == records


def test_an_input_named_like_a_temporary_file_is_read_not_swept(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    path, records = jsonl
    one = tmp_path / "one.crec"
    ok("convert", path, one)
    odd = tmp_path / ".one.crec.0123abcd.partial"  # chute's temporary-name pattern and magic
    odd.write_bytes(one.read_bytes())
    kept = odd.read_bytes()
    ok("convert", "--from", "crec", odd, one, "--overwrite")
    assert odd.read_bytes() == kept
    assert records_of(one) == records


def test_an_empty_leftover_temporary_file_is_swept(
    tmp_path: Path, jsonl: tuple[Path, list[bytes]]
) -> None:
    """A writer killed before its first buffered bytes reached the file leaves it empty:
    it holds nothing, so a later write removes it; a file with other bytes stays."""
    path, records = jsonl
    one = tmp_path / "one.crec"
    ok("convert", path, one)
    empty = tmp_path / ".one.crec.0123abce.partial"
    empty.write_bytes(b"")
    decoy = tmp_path / ".one.crec.0123abcd.partial"
    decoy.write_bytes(b"a user's file")
    ok("convert", path, one, "--overwrite")
    assert not empty.exists()
    assert decoy.read_bytes() == b"a user's file"
    assert records_of(one) == records
