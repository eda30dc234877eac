"""Bad files: every reader raises chute.DataError naming the file, and none crashes.

Each format gets a missing, empty, directory, unreadable, truncated and corrupted input;
and a real file truncated in place while a source holds it open (run in a subprocess, so
a SIGBUS shows as a crash, returncode -7, rather than killing pytest).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest

import chute
from chute import sources
from chute.records import RecordWriter

REPO = Path(__file__).resolve().parents[2]
RECORDS = [b"record %05d " % i + bytes(range(256)) * (1 + i % 3) for i in range(400)]


def _masked_crc(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_crec(path: Path) -> None:
    with RecordWriter(path) as w:
        for r in RECORDS:
            w.write(r)


def write_arrayrecord(path: Path) -> None:
    from array_record.python.array_record_module import ArrayRecordWriter

    w = ArrayRecordWriter(str(path), "group_size:1")
    for r in RECORDS:
        w.write(r)
    w.close()


def write_tfrecord(path: Path) -> None:
    with open(path, "wb") as f:
        for r in RECORDS:
            head = struct.pack("<Q", len(r))
            f.write(
                head + struct.pack("<I", _masked_crc(head)) + r + struct.pack("<I", _masked_crc(r))
            )


def write_jsonl(path: Path) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps({"i": i, "text": "word " * (i % 50)}) + "\n" for i in range(400))


def write_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = [f"word {i} " * (i % 50) for i in range(400)]
    table = pa.table({"i": list(range(400)), "text": text})
    pq.write_table(table, path, row_group_size=100, compression="none")


def write_numpy(path: Path) -> None:
    np.save(path, np.arange(400 * 64, dtype=np.int64).reshape(400, 64))


FORMATS: dict[str, tuple[str, Callable[[Path], None], str]] = {
    # name: (file suffix, writer, source expression over `p`)
    "crec": (".crec", write_crec, "sources.RecordFileDataSource(p)"),
    "arrayrecord": (".array_record", write_arrayrecord, "sources.ArrayRecordDataSource(p)"),
    "tfrecord": (".tfrecord", write_tfrecord, "sources.TFRecordDataSource(p)"),
    "jsonl": (".jsonl", write_jsonl, "sources.JsonlDataSource(p)"),
    "parquet": (".parquet", write_parquet, "sources.ParquetDataSource(p)"),
    "numpy": (".npy", write_numpy, "sources.NumpyDataSource(p)"),
}


def open_source(fmt: str, path: Path) -> Any:
    return eval(FORMATS[fmt][2], {"sources": sources, "p": str(path)})


def read_all(fmt: str, path: Path) -> None:
    src = open_source(fmt, path)
    n = len(src)
    for i in range(n):
        src[i]
    src.__getitems__(list(range(n)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_file_names_the_path_and_chains_the_os_error(fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"absent{FORMATS[fmt][0]}"
    with pytest.raises(chute.DataError, match=r"absent\..*no such file") as info:
        read_all(fmt, path)
    assert isinstance(info.value.__cause__, FileNotFoundError)
    assert isinstance(info.value, FileNotFoundError)  # still caught by `except OSError`


@pytest.mark.parametrize("fmt", FORMATS)
def test_file_deleted_after_listing_names_the_path(fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"gone{FORMATS[fmt][0]}"
    FORMATS[fmt][1](path)
    src = open_source(fmt, path)  # listed, not yet opened
    path.unlink()
    with pytest.raises(chute.DataError, match=r"gone\..*no such file") as info:
        len(src)
    assert isinstance(info.value.__cause__, FileNotFoundError)


@pytest.mark.parametrize("fmt", ["crec", "arrayrecord", "parquet", "numpy"])
def test_empty_file_names_the_path(fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"empty{FORMATS[fmt][0]}"
    path.touch()
    with pytest.raises(chute.DataError, match=r"empty\.\S+: .*(empty|0 bytes|not a readable)"):
        read_all(fmt, path)


@pytest.mark.parametrize("fmt", ["tfrecord", "jsonl"])
def test_empty_file_is_a_valid_file_of_no_records(fmt: str, tmp_path: Path) -> None:
    # An empty JSON Lines or TFRecord file is well-formed: it holds no records.
    path = tmp_path / f"empty{FORMATS[fmt][0]}"
    path.touch()
    assert len(open_source(fmt, path)) == 0


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "crec"])
def test_directory_names_the_path(fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"adir{FORMATS[fmt][0]}"
    path.mkdir()
    with pytest.raises(chute.DataError, match=r"adir\.\S+: it is a directory") as info:
        read_all(fmt, path)
    assert isinstance(info.value.__cause__, IsADirectoryError)


def test_crec_directory_without_manifest_names_the_path(tmp_path: Path) -> None:
    # For .crec a directory means a dataset: its manifest is what is missing.
    path = tmp_path / "adir.crec"
    path.mkdir()
    with pytest.raises(chute.DataError, match=r"adir\.crec"):
        read_all("crec", path)


_UNREADABLE_SCRIPT = """
import os, sys
import chute
from chute import sources
import array_record.python.array_record_module, pyarrow.parquet  # loaded as root
os.setgroups([])
os.setgid(65534)
os.setuid(65534)  # from here on: nobody, to whom a mode-000 file is unreadable
p = sys.argv[1]
try:
    src = {expr}
    len(src)
    src[0]
    print("NO ERROR")
except chute.DataError as e:
    print("DataError:", e, "| cause:", type(e.__cause__).__name__)
"""


@pytest.mark.parametrize("fmt", FORMATS)
def test_unreadable_file_names_the_path(fmt: str, tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / f"locked{FORMATS[fmt][0]}"
    FORMATS[fmt][1](path)
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(chute.DataError, match=r"locked\.\S+: permission denied") as info:
            read_all(fmt, path)
        assert isinstance(info.value.__cause__, PermissionError)
        return
    # Root reads mode-000 files: read in a subprocess that becomes `nobody` once its
    # imports are done. The folder is handed over as an open descriptor, reached through
    # /proc/self/fd, because nobody may not walk pytest's root-only temporary directories.
    folder.chmod(0o711)
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
        script = _UNREADABLE_SCRIPT.replace("{expr}", FORMATS[fmt][2])
        proc = subprocess.run(
            [sys.executable, "-c", script, f"/proc/self/fd/{dfd}/{path.name}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            pass_fds=(dfd,),
        )
    finally:
        os.close(dfd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("DataError:"), proc.stdout + proc.stderr[-2000:]
    assert f"locked{FORMATS[fmt][0]}: permission denied" in proc.stdout
    assert proc.stdout.rstrip().endswith("cause: PermissionError")


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_file_names_the_path(fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"half{FORMATS[fmt][0]}"
    FORMATS[fmt][1](path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(chute.DataError, match=r"half\."):
        read_all(fmt, path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_garbage_file_names_the_path(fmt: str, tmp_path: Path) -> None:
    path = tmp_path / f"junk{FORMATS[fmt][0]}"
    path.write_bytes(b"\xff\x00 not a data file {\n\x93NUMPY\x01\x00{'descr" * 50)
    with pytest.raises(chute.DataError, match=r"junk\."):
        read_all(fmt, path)


def test_numpy_bad_header_is_a_data_error(tmp_path: Path) -> None:
    # A header that tokenize cannot read used to escape as tokenize.TokenError.
    path = tmp_path / "bad.npy"
    write_numpy(path)
    data = bytearray(path.read_bytes())
    data[10:30] = b"{'descr': '<i8', (((["
    path.write_bytes(bytes(data))
    with pytest.raises(chute.DataError, match=r"bad\.npy: not a readable \.npy file"):
        read_all("numpy", path)


def test_parquet_invalid_utf8_names_the_record(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    marker = "MARKER-" + "q" * 40
    table = pa.table({"text": ["fine"] * 5 + [marker] + ["fine"] * 4})
    pq.write_table(table, path, compression="none", use_dictionary=False, write_statistics=False)
    data = path.read_bytes()
    pos = data.index(marker.encode())
    path.write_bytes(data[:pos] + b"\xff\xfe" + data[pos + 2 :])
    src = sources.ParquetDataSource(str(path))
    assert src[0] == {"text": "fine"}
    with pytest.raises(chute.DataError, match=r"bad\.parquet: record 5 \(row group 0\)"):
        src[5]
    with pytest.raises(chute.DataError, match=r"bad\.parquet: record 5 \(row group 0\)"):
        src.__getitems__(list(range(10)))


def test_arrayrecord_bad_file_error_names_the_file_not_a_type_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.array_record"
    write_arrayrecord(path)
    data = path.read_bytes()
    path.write_bytes(data[:-200])
    with pytest.raises(chute.DataError, match=r"bad\.array_record: cannot open as an ArrayRecord"):
        len(sources.ArrayRecordDataSource(str(path)))


# -- files truncated while open ----------------------------------------------------------

_TRUNCATE_SCRIPT = """
import os, sys
import chute
from chute import sources
p, how = sys.argv[1], sys.argv[2]
src = {expr}
n = len(src)
first = src[0]  # opened, mapped and (for ArrayRecord) indexed
os.truncate(p, 4096)
raised = []
try:
    if how == "single":
        for i in range(n):
            src[i]
    elif how == "block":
        src.__getitems__(list(range(n)))
    elif how == "read_into":
        src.read_into(list(range(n)), bytearray(src.record_sizes(list(range(n))).sum()))
    print("NO ERROR")
except chute.DataError as e:
    print("DataError:", e)
"""


@pytest.mark.parametrize("how", ["single", "block"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_file_truncated_while_open_raises_data_error_not_sigbus(
    fmt: str, how: str, tmp_path: Path
) -> None:
    path = tmp_path / f"shrinks{FORMATS[fmt][0]}"
    FORMATS[fmt][1](path)
    assert path.stat().st_size > 4 * 4096
    proc = _run_truncation(fmt, path, how)
    assert proc.returncode == 0, f"the reader crashed (returncode {proc.returncode})"
    out = proc.stdout
    if fmt == "parquet":  # read through pyarrow's own buffered reads: no map to fault
        assert "Error" in out or "NO ERROR" in out, out
        return
    assert out.startswith("DataError:"), out + proc.stderr[-2000:]
    assert str(path) in out
    assert "shrank" in out


def test_crec_read_into_after_truncation_raises_data_error(tmp_path: Path) -> None:
    path = tmp_path / "shrinks.crec"
    write_crec(path)
    proc = _run_truncation("crec", path, "read_into")
    assert proc.returncode == 0, f"the reader crashed (returncode {proc.returncode})"
    assert proc.stdout.startswith("DataError:") and str(path) in proc.stdout, proc.stdout


def _run_truncation(fmt: str, path: Path, how: str) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(_TRUNCATE_SCRIPT).replace("{expr}", FORMATS[fmt][2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", script, str(path), how],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


# -- file leases: truncated by another process or thread, with and without a lease ------

MAPPED = [f for f in FORMATS if f != "parquet"]  # the readers that map files


def _leases_available(tmp_path: Path) -> str | None:
    """None if this process can take a read lease on a file in tmp_path, else why not."""
    if sys.platform != "linux":
        return "file leases are Linux's"
    if Path("/proc/sys/fs/leases-enable").read_text().strip() == "0":
        return "leases are turned off (/proc/sys/fs/leases-enable is 0)"
    import fcntl

    probe = tmp_path / "lease-probe"
    probe.write_bytes(b"x")
    fd = os.open(probe, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError as e:
        return f"this file system or user cannot take leases ({e})"
    finally:
        os.close(fd)
        probe.unlink()
    return None


_LEASE_SCRIPT = """
import os, subprocess, sys, threading
import chute
from chute import sources
p, by = sys.argv[1], sys.argv[2]

def leases_held():
    ino, pid = os.stat(p).st_ino, os.getpid()
    return sum(
        " LEASE " in line and f" {pid} " in line and f":{ino} " in line
        for line in open("/proc/locks")
    )

src = {expr}
n = len(src)
first = src[0]
print("leases:", leases_held())
if by == "process":  # the writer waits until this process lets go of its lease
    subprocess.run(
        [sys.executable, "-c", "import os, sys; os.truncate(sys.argv[1], 4096)", p],
        check=True,
        timeout=30,  # well under lease-break-time (45 s): the lease thread answered
    )
else:
    t = threading.Thread(target=os.truncate, args=(p, 4096))
    t.start()
    t.join(timeout=30)
    assert not t.is_alive(), "the truncating thread is still waiting"
assert os.path.getsize(p) == 4096
print("leases after:", leases_held())
for how in ("single", "block"):
    try:
        if how == "single":
            for i in range(n):
                src[i]
        else:
            src.__getitems__(list(range(n)))
        print(how, "NO ERROR")
    except chute.DataError as e:
        print(how, "DataError:", e)
close = getattr(src, "close", None)
if close is not None:
    close()
for t in threading.enumerate():  # the lease thread ends once no lease is left
    if t.name == "chute-file-leases":
        t.join(timeout=30)
print("threads:", sorted(t.name for t in threading.enumerate()))
"""


def _run_lease_script(
    fmt: str, path: Path, by: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(_LEASE_SCRIPT).replace("{expr}", FORMATS[fmt][2])
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", script, str(path), by],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def _assert_shrank_reported(out: str, path: Path) -> None:
    for how in ("single", "block"):
        line = next(x for x in out.splitlines() if x.startswith(how + " "))
        assert line.startswith(f"{how} DataError:"), out
        assert str(path) in line and "shrank" in line, line


@pytest.mark.parametrize("by", ["process", "thread"])
@pytest.mark.parametrize("fmt", MAPPED)
def test_leased_file_truncated_by_another_process_or_thread_raises_data_error(
    fmt: str, by: str, tmp_path: Path
) -> None:
    if why := _leases_available(tmp_path):
        pytest.skip(why)
    path = tmp_path / f"leased{FORMATS[fmt][0]}"
    FORMATS[fmt][1](path)
    proc = _run_lease_script(fmt, path, by, env={"CHUTE_FILE_LEASES": "1"})  # opt-in
    assert proc.returncode == 0, f"returncode {proc.returncode} (-7: SIGBUS)\n{proc.stderr}"
    out = proc.stdout
    assert "leases: 1\n" in out, out  # the source really held a lease on the file
    assert "leases after: 0\n" in out, out  # given up for the writer
    _assert_shrank_reported(out, path)
    assert "chute-file-leases" not in out.splitlines()[-1], out  # the thread has ended


@pytest.mark.parametrize("switch", ["0", None])  # turned off, and the default
@pytest.mark.parametrize("by", ["process", "thread"])
@pytest.mark.parametrize("fmt", ["crec", "numpy"])
def test_leases_turned_off_fall_back_to_the_size_check(
    fmt: str, by: str, switch: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / f"unleased{FORMATS[fmt][0]}"
    FORMATS[fmt][1](path)
    monkeypatch.delenv("CHUTE_FILE_LEASES", raising=False)
    proc = _run_lease_script(
        fmt, path, by, env={} if switch is None else {"CHUTE_FILE_LEASES": switch}
    )
    assert proc.returncode == 0, f"returncode {proc.returncode} (-7: SIGBUS)\n{proc.stderr}"
    assert "leases: 0\n" in proc.stdout, proc.stdout
    _assert_shrank_reported(proc.stdout, path)
    assert "chute-file-leases" not in proc.stdout, proc.stdout


_FORK_SCRIPT = """
import os, subprocess, sys
import chute
from chute import sources
p = sys.argv[1]
src = sources.RecordFileDataSource(p)
n = len(src)
src[0]  # opened and leased in the parent
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # the child shares the parent's open file, and so its lease
    os.read(r, 1)  # until the file is truncated
    try:
        for i in range(n):
            src[i]
        os._exit(1)
    except chute.DataError:
        os._exit(3)
subprocess.run(
    [sys.executable, "-c", "import os, sys; os.truncate(sys.argv[1], 4096)", p],
    check=True,
    timeout=30,
)
os.write(w, b"x")
_, status = os.waitpid(pid, 0)
print("child:", os.waitstatus_to_exitcode(status))
try:
    for i in range(n):
        src[i]
    print("parent: NO ERROR")
except chute.DataError as e:
    print("parent: DataError:", e)
"""


def test_forked_child_of_a_leased_source_checks_sizes_and_parent_still_notices(
    tmp_path: Path,
) -> None:
    if why := _leases_available(tmp_path):
        pytest.skip(why)
    path = tmp_path / "forked.crec"
    write_crec(path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    env["CHUTE_FILE_LEASES"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FORK_SCRIPT), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "child: 3\n" in proc.stdout, proc.stdout  # DataError; -7 would be a SIGBUS
    assert "parent: DataError:" in proc.stdout and "shrank" in proc.stdout, proc.stdout


def test_a_lease_switch_that_is_neither_on_nor_off_is_refused_where_a_file_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "switch.crec"
    write_crec(path)
    monkeypatch.setenv("CHUTE_FILE_LEASES", "maybe")
    with pytest.raises(ValueError, match=r"CHUTE_FILE_LEASES='maybe' is neither on nor off"):
        sources.RecordFileDataSource(str(path))[0]


_FD_LIMIT_SCRIPT = """
import resource, sys
import chute
from chute import sources

resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    for _ in range(200):
        src = sources.RecordFileDataSource(sys.argv[1])
        src[0]  # opened, and kept open
        held.append(src)
    print("opened all")
except chute.DataError as e:
    print("DataError:", e)
print("soft limit:", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def test_running_out_of_descriptors_is_an_error_and_the_limit_is_left_as_found(
    tmp_path: Path,
) -> None:
    # The user's process: chute raises no rlimit there (its workers raise their own).
    path = tmp_path / "many.crec"
    write_crec(path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FD_LIMIT_SCRIPT), str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "soft limit: 64\n" in proc.stdout, proc.stdout
    assert f"DataError: {path}: too many open files in this process (RLIMIT_NOFILE 64)" in (
        proc.stdout
    ), proc.stdout
    assert "ulimit -n" in proc.stdout, proc.stdout
