"""Caches are trusted only when they prove they are chute's, this user's and this file's:
index caches (JSONL, TFRecord, ArrayRecord), disk caches (`.cache(path)`) and the
shared-list files of large list sources.

A planted index cache is written here as an attacker would: the documented layout (a
fixed header, then little-endian uint64 values) with a correct body CRC32C, so only
chute's other checks can reject it.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest

import chute
import shm_helpers
from chute.records import RecordWriter
from chute.sources import (
    ArrayRecordDataSource,
    JsonlDataSource,
    RandomAccessDataSource,
    TFRecordDataSource,
)

# magic, version, kind, device, inode, size, mtime_ns, ctime_ns, sample CRC, count, body CRC
HEADER = struct.Struct("<8sI16sQQQqqIQI")
IS_ROOT = os.geteuid() == 0
OTHER_UID = 54321


@pytest.fixture(autouse=True)
def _caches_beside_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests plant index caches beside the data, where `CHUTE_INDEX_CACHE=beside`
    keeps them (and where older versions wrote them, which are still read)."""
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "beside")
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path / "default-user-cache"))


def _jsonl(path: Path, text: bytes) -> Path:
    path.write_bytes(text)
    return path


def _records(source: RandomAccessDataSource[Any]) -> list[Any]:
    """Every record of a random-access source, in order."""
    return [source[i] for i in range(len(source))]


def _cache_beside(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}.chute-index")


def _plant(cache: Path, values: list[int]) -> None:
    """Rewrites `cache` (a real one) with `values` as its body and a correct body CRC."""
    raw = cache.read_bytes()
    fields = list(HEADER.unpack_from(raw))
    body = np.array(values, dtype=np.int64).astype("<u8").tobytes()
    fields[-2], fields[-1] = len(values), crc32c.crc32c(body)
    cache.write_bytes(HEADER.pack(*fields) + body)
    os.chmod(cache, 0o600)


def test_same_size_edit_with_the_mtime_restored_gives_the_new_records(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "d.jsonl", b"10\n20\n30\n")
    assert [JsonlDataSource(path)[i] for i in range(3)] == [10, 20, 30]  # cache written
    st = path.stat()
    path.write_bytes(b"100\n2\n30\n")  # same size, other line boundaries
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    src = JsonlDataSource(path)
    assert [src[i] for i in range(len(src))] == [100, 2, 30]


def test_same_size_edit_of_a_tfrecord_file_is_seen(tmp_path: Path) -> None:
    def frame(data: bytes) -> bytes:
        head = struct.pack("<Q", len(data))
        return head + struct.pack("<I", _masked(head)) + data + struct.pack("<I", _masked(data))

    path = tmp_path / "a.tfrecord"
    path.write_bytes(frame(b"ab") + frame(b"cd"))
    assert _records(TFRecordDataSource(str(path))) == [b"ab", b"cd"]
    st = path.stat()
    path.write_bytes(frame(b"abcd") + frame(b""))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _records(TFRecordDataSource(str(path))) == [b"abcd", b""]


def _masked(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize(
    "spans",
    [
        [0, 1, -2, -1, 4, 5],  # negative
        [0, 1, 4, 5, 4, 100],  # past the end
        [0, 1, 4, 5, 2, 3],  # out of order
        [0, 1, 4, 5, 4, 5],  # overlapping
        [0, 1, 2, 3, 4],  # an odd count
    ],
)
def test_planted_jsonl_spans_are_checked_and_rebuilt(tmp_path: Path, spans: list[int]) -> None:
    path = _jsonl(tmp_path / "d.jsonl", b"1\n2\n3\n")
    len(JsonlDataSource(path))
    cache = _cache_beside(path, "jsonl-lines")
    _plant(cache, spans)
    src = JsonlDataSource(path)
    assert [src[i] for i in range(len(src))] == [1, 2, 3]
    assert HEADER.unpack_from(cache.read_bytes())[-2] == 6  # rewritten by chute


@pytest.mark.parametrize("spans", [[12, 2, 30, 3], [12, 2, 30, 2], [-4, 2, 30, 2], [12, 99]])
def test_planted_tfrecord_spans_are_checked(tmp_path: Path, spans: list[int]) -> None:
    path = tmp_path / "a.tfrecord"
    head = struct.pack("<Q", 2)
    data = b"".join(
        head + struct.pack("<I", _masked(head)) + d + struct.pack("<I", _masked(d))
        for d in (b"ab", b"cd")
    )
    path.write_bytes(data)
    len(TFRecordDataSource(str(path)))
    _plant(_cache_beside(path, "tfrecord"), spans)
    assert _records(TFRecordDataSource(str(path))) == [b"ab", b"cd"]


def test_a_structurally_valid_arrayrecord_cache_still_has_to_agree_with_the_file(
    tmp_path: Path,
) -> None:
    """The cache holds the CRC32C each read is checked against, so a planted entry that
    points inside a record at bytes that look like a chunk, with their CRC, would pass
    every check of the cache alone: the records are compared with the C++ reader."""
    from array_record.python import array_record_module

    records = [b"first", b"\x00\x00EVIL and more", b"third"]
    path = tmp_path / "a.array_record"
    w = array_record_module.ArrayRecordWriter(str(path), "group_size:1,uncompressed")
    for r in records:
        w.write(r)
    w.close()
    assert [ArrayRecordDataSource(str(path))[i] for i in range(3)] == records
    cache = _cache_beside(path, "arrayrecord-crc")
    values = np.frombuffer(cache.read_bytes()[HEADER.size :], dtype="<u8").astype(np.int64)
    fake = path.read_bytes().index(b"\x00\x00EVIL")
    values[4:8] = (fake, 6, 4, crc32c.crc32c(b"EVIL"))
    _plant(cache, values.tolist())
    assert [ArrayRecordDataSource(str(path))[i] for i in range(3)] == records


def _wrong_but_valid(tmp_path: Path) -> tuple[Path, Path]:
    """A JSONL file and a cache beside it that is well formed but gives other records."""
    path = _jsonl(tmp_path / "d.jsonl", b"10\n20\n30\n")
    len(JsonlDataSource(path))
    cache = _cache_beside(path, "jsonl-lines")
    _plant(cache, [0, 1, 3, 4, 6, 7])  # would read 1, 2, 3
    return path, cache


def test_a_well_formed_cache_is_used_when_it_is_ours(tmp_path: Path) -> None:
    """The control for the tests below: without them, the planted cache would be read."""
    path, _ = _wrong_but_valid(tmp_path)
    assert _records(JsonlDataSource(path)) == [1, 2, 3]


def test_a_group_writable_or_symlinked_cache_is_ignored(tmp_path: Path) -> None:
    path, cache = _wrong_but_valid(tmp_path)
    os.chmod(cache, 0o664)
    assert _records(JsonlDataSource(path)) == [10, 20, 30]
    assert cache.stat().st_mode & 0o777 == 0o600  # replaced by chute's own, 0600
    _plant(cache, [0, 1, 3, 4, 6, 7])
    elsewhere = tmp_path / "planted"
    cache.rename(elsewhere)
    cache.symlink_to(elsewhere)
    assert _records(JsonlDataSource(path)) == [10, 20, 30]
    assert not cache.is_symlink() and elsewhere.read_bytes() != cache.read_bytes()


@pytest.mark.skipif(not IS_ROOT, reason="os.chown to another uid needs root")
def test_a_cache_owned_by_another_user_is_ignored(tmp_path: Path) -> None:
    path, cache = _wrong_but_valid(tmp_path)
    os.chown(cache, OTHER_UID, OTHER_UID)
    assert _records(JsonlDataSource(path)) == [10, 20, 30]
    assert cache.stat().st_uid == os.geteuid()


def _user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    user_dir = tmp_path / "user-cache" / "chute"
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(user_dir))
    return user_dir


def test_a_read_only_data_directory_gets_a_cache_in_the_user_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule reads the directory's mode (its owner may not write), not whether a write
    would succeed: as root, writes into a 0555 directory succeed, and the rule still holds."""
    user_dir = _user_cache(monkeypatch, tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    path = _jsonl(data / "d.jsonl", b"1\n2\n")
    data.chmod(0o555)
    try:
        assert _records(JsonlDataSource(path)) == [1, 2]
        assert sorted(p.name for p in data.iterdir()) == ["d.jsonl"]
        (cache,) = user_dir.iterdir()
        assert cache.name.endswith(".jsonl-lines.chute-index")
        assert user_dir.stat().st_mode & 0o777 == 0o700
        assert cache.stat().st_mode & 0o777 == 0o600
        inode = cache.stat().st_ino
        assert _records(JsonlDataSource(path)) == [1, 2]
        assert cache.stat().st_ino == inode  # read, not rewritten
    finally:
        data.chmod(0o755)


@pytest.mark.skipif(not IS_ROOT, reason="os.chown to another uid needs root")
def test_a_directory_of_another_user_is_never_used_for_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user_dir = _user_cache(monkeypatch, tmp_path)
    data = tmp_path / "theirs"
    data.mkdir()
    path, cache = _wrong_but_valid(data)
    os.chown(cache, OTHER_UID, OTHER_UID)
    os.chown(data, OTHER_UID, OTHER_UID)
    assert _records(JsonlDataSource(path)) == [10, 20, 30]
    assert cache.stat().st_uid == OTHER_UID  # their file, left alone
    assert len(list(user_dir.glob("*.jsonl-lines.chute-index"))) == 1


def test_an_unsafe_user_cache_dir_means_no_cache_not_a_wrong_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user_dir = _user_cache(monkeypatch, tmp_path)
    user_dir.mkdir(parents=True)
    user_dir.chmod(0o777)
    data = tmp_path / "data"
    data.mkdir()
    path = _jsonl(data / "d.jsonl", b"1\n2\n")
    data.chmod(0o555)
    try:
        assert _records(JsonlDataSource(path)) == [1, 2]
    finally:
        data.chmod(0o755)
    assert list(user_dir.iterdir()) == []


# Disk caches (`.cache(path)`).


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: int) -> int:
        self.calls += 1
        return x * 10


def _cached(tmp_path: Path, counter: Counter) -> Any:
    return chute.MapDataset.range(5).to_iter_dataset().map(counter).cache(tmp_path)


def test_a_disk_cache_is_read_only_when_it_is_ours_and_bound_to_the_pipeline(
    tmp_path: Path,
) -> None:
    ds = _cached(tmp_path, Counter())
    assert list(ds) == [0, 10, 20, 30, 40]
    file = ds.directory / "elements.crec"
    assert file.stat().st_mode & 0o777 == 0o600
    assert ds.directory.stat().st_mode & 0o777 == 0o700
    # A chute record file, not bound to this pipeline (its records are not even elements).
    file.unlink()
    with RecordWriter(file, metadata={"chute_cache": "another pipeline"}) as w:
        for _ in range(5):
            w.write(b"not an element")
    file.chmod(0o600)
    again = Counter()
    assert list(_cached(tmp_path, again)) == [0, 10, 20, 30, 40]
    assert again.calls == 5  # not read: recomputed and rewritten
    reused = Counter()
    assert list(_cached(tmp_path, reused)) == [0, 10, 20, 30, 40] and reused.calls == 0


@pytest.mark.parametrize("how", ["group-writable", "other owner", "unsafe directory"])
def test_a_disk_cache_that_is_not_provably_ours_is_not_read(tmp_path: Path, how: str) -> None:
    if how == "other owner" and not IS_ROOT:
        pytest.skip("os.chown to another uid needs root")
    ds = _cached(tmp_path, Counter())
    list(ds)
    file = ds.directory / "elements.crec"
    if how == "group-writable":
        file.chmod(0o664)
    elif how == "other owner":
        os.chown(file, OTHER_UID, OTHER_UID)
    else:
        ds.directory.chmod(0o777)
    counter = Counter()
    if how == "unsafe directory":
        with pytest.warns(UserWarning, match="is not a directory owned by this user"):
            assert list(_cached(tmp_path, counter)) == [0, 10, 20, 30, 40]
    else:
        assert list(_cached(tmp_path, counter)) == [0, 10, 20, 30, 40]
        assert file.stat().st_uid == os.geteuid() and file.stat().st_mode & 0o777 == 0o600
    assert counter.calls == 5


@pytest.mark.parametrize("what", ["text", "symlink", "directory"])
def test_a_file_chute_did_not_write_is_never_read_or_replaced(tmp_path: Path, what: str) -> None:
    ds = _cached(tmp_path, Counter())
    file = ds.directory / "elements.crec"
    ds.directory.mkdir(mode=0o700)
    if what == "text":
        file.write_bytes(b"my notes, not a cache")
    elif what == "symlink":
        (tmp_path / "target").write_bytes(b"")
        file.symlink_to(tmp_path / "target")
    else:
        file.mkdir()
    with pytest.raises(
        FileExistsError, match=r"elements\.crec exists and was not written by chute"
    ):
        list(ds)
    assert file.is_symlink() if what == "symlink" else file.exists()
    if what == "text":
        assert file.read_bytes() == b"my notes, not a cache"


# Shared-list files (large list sources with worker processes).


def _list_pipeline() -> chute.IterDataset[Any]:
    ds = chute.MapDataset.source(list(range(20_000))).to_iter_dataset()
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1))


def _list_files() -> set[str]:
    return {e for e in os.listdir("/dev/shm") if e.startswith("chute_list_")}


needs_shm = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")


@needs_shm
def test_shared_list_files_are_private() -> None:
    """The list's file has no name (nothing else can open it) and is 0600 all the same."""
    names = _list_files()
    before = shm_helpers.held_shared_files(magic=shm_helpers.LIST_MAGIC)
    it = iter(_list_pipeline())
    try:
        assert next(it) == 0
        (made,) = shm_helpers.held_shared_files(magic=shm_helpers.LIST_MAGIC) - before
        fds = Path("/proc/self/fd")
        (link,) = [fd for fd in fds.iterdir() if _inode(fd) == made]
        assert os.stat(link).st_mode & 0o777 == 0o600
        assert _list_files() == names
    finally:
        it.close()
    assert made not in shm_helpers.held_shared_files(magic=shm_helpers.LIST_MAGIC)


def _inode(link: Path) -> int | None:
    try:
        return os.stat(link).st_ino if os.readlink(link).startswith("/dev/shm/") else None
    except OSError:
        return None


HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    path = sys.argv[1]
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.utime(path, (0, 0))  # as old as can be: only the lock keeps it
    print("holding", flush=True)
    sys.stdin.read()
    os.unlink(path)
    """
)


@needs_shm
def test_the_sweep_keeps_files_held_by_live_processes_whatever_their_pid() -> None:
    """The holder is a live process; the PID in its file name exists in no namespace here
    (it is above any pid_max), as for a job in another container sharing /dev/shm."""
    held = Path("/dev/shm") / f"chute_list_999999999_{os.urandom(8).hex()}"
    stale = Path("/dev/shm") / f"chute_list_999999998_{os.urandom(8).hex()}"
    young = Path("/dev/shm") / f"chute_list_999999997_{os.urandom(8).hex()}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(held)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        stale.write_bytes(b"left by a killed process")
        os.utime(stale, (0, 0))
        young.write_bytes(b"just created, not locked yet")
        assert list(_list_pipeline())[:3] == [0, 1, 2]  # making a list file sweeps
        assert held.exists()
        assert not stale.exists()
        assert young.exists()
    finally:
        holder.communicate("", timeout=30)
        young.unlink(missing_ok=True)
        stale.unlink(missing_ok=True)
    assert not held.exists()
