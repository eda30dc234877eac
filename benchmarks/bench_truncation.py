"""How a mapped `.crec` / ArrayRecord reader should guard against a file truncated while it
reads: the size check alone, `pread`, or a kernel read lease. Random reads, one process,
warm page cache.

A reader that maps a file and reads past an end the file no longer has is killed by
SIGBUS. Three ways to turn that into a `DataError`:

- **size check** (chute's default): one `os.lseek(fd, 0, SEEK_END)` per `src[i]` (once per
  `__getitems__` block), compared with the size at open;
- **lease** (`CHUTE_FILE_LEASES=1`): a kernel read lease makes writers wait while the
  reader is told, by a real-time signal, to stop using the map: a flag test per read, but
  a signal handler, a thread and a fork hook in the process;
- **pread**: no map at all; `os.pread` returns fewer bytes for a truncated file (no
  signal can come), one system call and one copy per record.

Rows: chute's readers with the size check and with a lease (the whole `src[i]` path), and
three bare loops doing one record's work (the copy out and its CRC32C check) with each
guard, so that the guard's own cost is what differs.

    .venv/bin/python benchmarks/bench_truncation.py [--records 120000] [--reads 200000]
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import machine, rates, table
from chute._src.storage.records import checksum
from chute.records import RecordWriter
from chute.sources import ArrayRecordDataSource, RecordFileDataSource


def write_files(d: Path, n: int) -> tuple[Path, Path | None]:
    rng = random.Random(0)
    words = [
        bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(5000)
    ]
    records = [b" ".join(rng.choice(words) for _ in range(rng.randint(10, 150))) for _ in range(n)]
    crec = d / "data.crec"
    with RecordWriter(crec) as w:
        for r in records:
            w.write(r)
    try:
        from array_record.python.array_record_module import ArrayRecordWriter
    except ImportError:
        return crec, None
    ar = d / "data.array_record"
    writer = ArrayRecordWriter(str(ar), "group_size:1")
    for r in records:
        writer.write(r)
    writer.close()
    return crec, ar


def index(path: Path) -> tuple[list[int], list[int], list[int]]:
    """Offsets, lengths and CRC32Cs of a .crec file's records."""
    src = RecordFileDataSource(str(path))
    f = src._open()[0]
    out = list(f.offsets), list(f.lengths), list(f.crcs)
    src.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=120_000)
    p.add_argument("--reads", type=int, default=200_000)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    d = args.workdir or Path(tempfile.mkdtemp(prefix="chute-trunc-"))
    crec, ar = write_files(d, args.records)
    offs, lens, crcs = index(crec)
    rng = random.Random(1)
    idx = [rng.randrange(args.records) for _ in range(args.reads)]
    blocks = [idx[k : k + 1000] for k in range(0, len(idx), 1000)]

    def opened(src: Any) -> Any:
        src[0]  # sources open their files on first use
        return src

    os.environ.pop("CHUTE_FILE_LEASES", None)
    plain = opened(RecordFileDataSource(str(crec)))
    plain_ar = opened(ArrayRecordDataSource(str(ar))) if ar else None
    os.environ["CHUTE_FILE_LEASES"] = "1"
    leased = opened(RecordFileDataSource(str(crec)))
    leased_ar = opened(ArrayRecordDataSource(str(ar))) if ar else None
    os.environ.pop("CHUTE_FILE_LEASES")
    for src in (plain, leased, plain_ar, leased_ar):
        if src is not None:
            for i in range(0, args.records, 5):
                src[i]  # warms the page cache
    inodes, pid = {crec.stat().st_ino, *([ar.stat().st_ino] if ar else [])}, os.getpid()
    held = [
        line
        for line in Path("/proc/locks").read_text().splitlines()
        if " LEASE " in line and f" {pid} " in line and any(f":{i} " in line for i in inodes)
    ]
    print(f"# {machine()}")
    print(f"# leases held by the leased sources: {len(held)} ({'; '.join(held) or 'none'})")
    print(f"# CRC32C: {checksum.IMPLEMENTATION}\n")

    fd = os.open(crec, os.O_RDONLY)
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    crc = checksum.crc32c
    lseek, pread = os.lseek, os.pread

    class Flag:
        leased = True

    flag = Flag()

    def bare_size_check() -> int:
        for i in idx:
            if lseek(fd, 0, 2) < size:
                raise RuntimeError("shrank")
            o = offs[i]
            data = mm[o : o + lens[i]]
            if crc(data) != crcs[i]:
                raise RuntimeError("crc")
        return len(idx)

    def bare_lease() -> int:
        for i in idx:
            if not flag.leased and lseek(fd, 0, 2) < size:
                raise RuntimeError("shrank")
            o = offs[i]
            data = mm[o : o + lens[i]]
            if crc(data) != crcs[i]:
                raise RuntimeError("crc")
        return len(idx)

    def bare_pread() -> int:
        for i in idx:
            n = lens[i]
            data = pread(fd, n, offs[i])
            if len(data) != n:
                raise RuntimeError("shrank")
            if crc(data) != crcs[i]:
                raise RuntimeError("crc")
        return len(idx)

    def bare_pread_block() -> int:
        for block in blocks:
            for i in block:
                n = lens[i]
                data = pread(fd, n, offs[i])
                if len(data) != n or crc(data) != crcs[i]:
                    raise RuntimeError("bad")
        return len(idx)

    def bare_size_check_block() -> int:
        for block in blocks:
            if lseek(fd, 0, 2) < size:
                raise RuntimeError("shrank")
            for i in block:
                o = offs[i]
                if crc(mm[o : o + lens[i]]) != crcs[i]:
                    raise RuntimeError("crc")
        return len(idx)

    def single(src: Any) -> Callable[[], int]:
        def run() -> int:
            get = src.__getitem__
            for i in idx:
                get(i)
            return len(idx)

        return run

    def block(src: Any) -> Callable[[], int]:
        def run() -> int:
            get = src.__getitems__
            for b in blocks:
                get(b)
            return len(idx)

        return run

    runs = {
        "crec src[i], size check (default)": single(plain),
        "crec src[i], lease": single(leased),
        "crec __getitems__(1000), size check (default)": block(plain),
        "crec __getitems__(1000), lease": block(leased),
        "bare loop src[i]: mmap + size check": bare_size_check,
        "bare loop src[i]: mmap + lease flag": bare_lease,
        "bare loop src[i]: pread": bare_pread,
        "bare loop blocks of 1000: mmap + one size check": bare_size_check_block,
        "bare loop blocks of 1000: pread per record": bare_pread_block,
    }
    if plain_ar is not None and leased_ar is not None:
        runs["ArrayRecord src[i], size check (default)"] = single(plain_ar)
        runs["ArrayRecord src[i], lease"] = single(leased_ar)
    r = rates(runs, repeats=5)
    rows = [
        [name, f"{1e9 / rate:.0f} ns/read", f"{rate / 1e6:.2f} M/s"] for name, rate in r.items()
    ]
    print(table(["random reads", "per read", "rate"], rows))
    for src in (plain, leased, plain_ar, leased_ar):
        close = getattr(src, "close", None)
        if close is not None:
            close()
    mm.close()
    os.close(fd)


if __name__ == "__main__":
    main()
