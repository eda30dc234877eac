"""Where index caches live: in the per-user cache directory, never in the data's folder
unless `CHUTE_INDEX_CACHE=beside` asks; caches an older chute wrote beside the data are
still read; a cache is reused across processes and never trusted for a changed file."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import crc32c
import numpy as np
import pytest

from chute.cli import main
from chute.sources import ArrayRecordDataSource, JsonlDataSource, TFRecordDataSource
from process_helpers import run_python

# magic, version, kind, device, inode, size, mtime_ns, ctime_ns, sample CRC, count, body CRC
HEADER = struct.Struct("<8sI16sQQQqqIQI")
ROWS = [b'{"i": %d, "text": "%s"}' % (i, b"x" * (i % 7)) for i in range(60)]


def _masked(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _write(folder: Path, fmt: str) -> Path:
    if fmt == "jsonl":
        path = folder / "d.jsonl"
        path.write_bytes(b"\n".join(ROWS) + b"\n")
    elif fmt == "tfrecord":
        path = folder / "d.tfrecord"
        with open(path, "wb") as f:
            for r in ROWS:
                head = struct.pack("<Q", len(r))
                f.write(head + struct.pack("<I", _masked(head)) + r + struct.pack("<I", _masked(r)))
    else:
        from array_record.python import array_record_module

        path = folder / "d.array_record"
        w = array_record_module.ArrayRecordWriter(str(path), "group_size:1")
        for r in ROWS:
            w.write(r)
        w.close()
    return path


def _read_all(path: Path) -> list[bytes]:
    src: JsonlDataSource | TFRecordDataSource | ArrayRecordDataSource
    if path.suffix == ".jsonl":
        src = JsonlDataSource(path, decode=False)
    elif path.suffix == ".tfrecord":
        src = TFRecordDataSource(str(path))
    else:
        src = ArrayRecordDataSource(str(path))
    return [src[i] for i in range(len(src))]


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too), by relative path, with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "user-cache"
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(d))
    monkeypatch.delenv("CHUTE_INDEX_CACHE", raising=False)
    return d


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.mark.parametrize("fmt", ["jsonl", "tfrecord", "arrayrecord"])
def test_reading_leaves_the_data_folder_as_it_was(user_dir: Path, data: Path, fmt: str) -> None:
    path = _write(data, fmt)
    before = _snapshot(data)
    assert _read_all(path) == ROWS
    assert _read_all(path) == ROWS  # the second time from the cache
    assert _snapshot(data) == before
    (cache,) = user_dir.iterdir()
    assert cache.name.endswith(".chute-index")
    assert cache.stat().st_mode & 0o777 == 0o600


def test_a_second_process_reuses_the_cache_in_the_user_dir(user_dir: Path, data: Path) -> None:
    path = _write(data, "jsonl")
    script = data.parent / "read.py"
    script.write_text(
        "import sys\nfrom chute.sources import JsonlDataSource\n"
        "src = JsonlDataSource(sys.argv[1])\nprint(len(src), src[59]['i'])\n"
    )
    env = {**os.environ, "CHUTE_CACHE_DIR": str(user_dir)}
    env.pop("CHUTE_INDEX_CACHE", None)
    first = run_python(data.parent, [str(script), str(path)], env=env, timeout=60)
    assert first.stdout.split() == ["60", "59"]
    (cache,) = user_dir.iterdir()
    written = cache.stat()
    time.sleep(0.02)  # a rewrite would show a later mtime (and a new inode: rename)
    second = run_python(data.parent, [str(script), str(path)], env=env, timeout=60)
    assert second.stdout.split() == ["60", "59"]
    (again,) = user_dir.iterdir()
    assert (again.stat().st_ino, again.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    assert sorted(p.name for p in data.iterdir()) == ["d.jsonl"]


def _plant(cache: Path, values: list[int]) -> None:
    """Rewrites `cache` (a real one) with `values` as its body and a correct body CRC."""
    raw = cache.read_bytes()
    fields = list(HEADER.unpack_from(raw))
    body = np.array(values, dtype=np.int64).astype("<u8").tobytes()
    fields[-2], fields[-1] = len(values), crc32c.crc32c(body)
    cache.write_bytes(HEADER.pack(*fields) + body)
    os.chmod(cache, 0o600)


def test_a_cache_an_older_version_wrote_beside_the_data_is_still_read(
    user_dir: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = data / "d.jsonl"
    path.write_bytes(b"10\n20\n30\n")
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "beside")  # writes as chute did before
    assert _read_all(path) == [b"10", b"20", b"30"]
    old = data / ".d.jsonl.jsonl-lines.chute-index"
    # Spans that read "1", "2", "3": the records show which cache was used.
    _plant(old, [0, 1, 3, 4, 6, 7])
    planted = old.read_bytes()
    monkeypatch.delenv("CHUTE_INDEX_CACHE")
    assert _read_all(path) == [b"1", b"2", b"3"]
    assert old.read_bytes() == planted  # read, not rewritten
    assert not user_dir.exists() or list(user_dir.iterdir()) == []


def test_a_changed_file_of_the_same_size_is_not_read_through_the_stale_cache(
    user_dir: Path, data: Path
) -> None:
    path = data / "d.jsonl"
    path.write_bytes(b"10\n20\n30\n")
    assert _read_all(path) == [b"10", b"20", b"30"]
    (cache,) = user_dir.iterdir()
    stale = cache.read_bytes()
    st = path.stat()
    path.write_bytes(b"100\n2\n30\n")  # same size, other line boundaries
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert _read_all(path) == [b"100", b"2", b"30"]
    assert cache.read_bytes() != stale  # rebuilt and written again
    assert sorted(p.name for p in data.iterdir()) == ["d.jsonl"]


def test_a_stale_cache_beside_the_data_is_not_used_nor_rewritten(
    user_dir: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = data / "d.jsonl"
    path.write_bytes(b"10\n20\n30\n")
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "beside")
    _read_all(path)
    old = data / ".d.jsonl.jsonl-lines.chute-index"
    stale = old.read_bytes()
    monkeypatch.delenv("CHUTE_INDEX_CACHE")
    path.write_bytes(b"100\n2\n30\n")
    assert _read_all(path) == [b"100", b"2", b"30"]
    assert old.read_bytes() == stale
    assert len(list(user_dir.iterdir())) == 1  # the new cache went to the user dir


def test_beside_and_off_are_asked_for_by_name(
    user_dir: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write(data, "jsonl")
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "off")
    assert _read_all(path) == ROWS
    assert not user_dir.exists() and sorted(p.name for p in data.iterdir()) == ["d.jsonl"]
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "beside")
    assert _read_all(path) == ROWS
    assert (data / ".d.jsonl.jsonl-lines.chute-index").is_file()
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "nearby")
    with pytest.raises(ValueError, match=r"CHUTE_INDEX_CACHE='nearby' is not one of user, beside"):
        JsonlDataSource(path)[0]


def test_old_caches_in_the_user_dir_are_removed_when_a_new_one_is_written(
    user_dir: Path, data: Path
) -> None:
    first = data / "a.jsonl"
    first.write_bytes(b"1\n")
    _read_all(first)
    (old,) = user_dir.iterdir()
    month_ago = time.time() - 31 * 86400
    os.utime(old, (month_ago, month_ago))
    theirs = user_dir / "notes.txt"
    theirs.write_text("not chute's")
    os.utime(theirs, (month_ago, month_ago))
    second = data / "b.jsonl"
    second.write_bytes(b"2\n")
    _read_all(second)
    names = sorted(p.name for p in user_dir.iterdir())
    assert old.name not in names and "notes.txt" in names and len(names) == 2


@pytest.mark.parametrize(("fmt", "to"), [("jsonl", "crec"), ("tfrecord", "arrayrecord")])
def test_chute_convert_writes_nothing_into_the_input_folder(
    user_dir: Path, data: Path, tmp_path: Path, fmt: str, to: str
) -> None:
    _write(data, fmt)
    before = _snapshot(data)
    out = tmp_path / "out"
    assert main(["convert", str(data / "*"), str(out), "--to", to, "--shards", "2"]) == 0
    assert main(["inspect", str(data / "*")]) == 0
    assert main(["verify", str(data / "*")]) == 0
    assert _snapshot(data) == before
    assert all(not p.name.startswith(".") for p in out.iterdir())
