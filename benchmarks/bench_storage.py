"""Storage: chute's readers and `.crec` format beside a bare mmap loop and Grain.

Runs, on the corpus from ../shared/data/make_corpus.py (120k records) and on 2,000
records of ~100 KB, warm page cache, one process, everything in one run:

- random single-record reads: `.crec` (checksums on, and off) against a bare
  mmap + offsets loop over the same file (the physical limit), and the cost of the
  size check a read makes when chute holds no lease on the file (one `os.lseek`, so a
  file truncated while open raises instead of crashing with SIGBUS: the default; with a
  lease, which `CHUTE_FILE_LEASES=1` turns on, a read tests a flag instead, and the
  output says which was in effect; `bench_truncation.py` compares them and `pread`),
  and the cost of one CRC32C call on a
  record alone. The output names the CRC32C code in effect: chute's native extension
  (built by `pip install -e .` with a C compiler) or the `crc32c` package;
  `CHUTE_CRC32C=package` forces the package, to compare the two in one sitting;
- random single-record reads: chute's `ArrayRecordDataSource` against
  `grain.sources.ArrayRecordDataSource` on the same ArrayRecord file;
- gathering 100 KB records into a reused buffer (`read_into`, checksums on) against a
  bare copy loop;
- converting JSONL -> `.crec` (MB/s), and file sizes against the raw JSONL and ArrayRecord.

    .venv/bin/python benchmarks/bench_storage.py [--records 120000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import mmap
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import chute.cli
from _harness import machine, rates, table
from chute._src.storage.records import checksum
from chute.records import RecordWriter
from chute.sources import ArrayRecordDataSource, JsonlDataSource, RecordFileDataSource

REPO = Path(__file__).resolve().parents[1]


def shared_data() -> Path:
    env = os.environ.get("CHUTE_SHARED_DATA")
    if env:
        return Path(env)
    for parent in REPO.parents:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    raise SystemExit("shared/data not found beside the checkout: set CHUTE_SHARED_DATA")


def bare_reader(path: Path) -> tuple[mmap.mmap, list[int], list[int]]:
    """The mmap of a .crec file and its offsets/lengths as Python lists (no checks)."""
    src = RecordFileDataSource(path)
    f = src._open()[0]
    offsets, lengths = list(f.offsets), list(f.lengths)
    src.close()
    with open(path, "rb") as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ), offsets, lengths


def lease_state(path: Path) -> str:
    """Whether this process holds a lease on `path` (/proc/locks lists it), in words."""
    try:
        locks = Path("/proc/locks").read_text()
    except OSError:
        return "unknown (no /proc/locks)"
    ino, pid = path.stat().st_ino, os.getpid()
    held = any(
        " LEASE " in f" {line} " and f" {pid} " in line and f":{ino} " in line
        for line in locks.splitlines()
    )
    if held:
        return "held on the .crec file: reads test a flag"
    return "not held on the .crec file: each read calls os.lseek"


def convert(inputs: Path, output: Path, *extra: str) -> float:
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = chute.cli.main(
            ["convert", str(inputs), str(output), "--overwrite", "--no-progress", *extra]
        )
    assert code == 0
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=120_000)
    p.add_argument("--reads", type=int, default=200_000, help="random reads per contender")
    p.add_argument("--grain-reads", type=int, default=2_000, help="grain is slow: fewer")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    grain: Any
    try:
        import grain
    except ImportError:  # grain is optional here: its rows are left out
        grain = None
    from array_record.python.array_record_module import ArrayRecordWriter

    warnings.filterwarnings("ignore")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="chute-bench-storage-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    if not corpus.exists():
        subprocess.run(
            [sys.executable, str(shared_data() / "make_corpus.py"), str(corpus), str(args.records)],
            check=True,
            capture_output=True,
        )
    lines = corpus.read_bytes().splitlines()
    n = len(lines)
    raw_mb = corpus.stat().st_size / 1e6
    print(f"# {machine()}")
    print(f"# corpus: {n:,} records, {raw_mb:.1f} MB of JSONL, in {work}\n")

    # -- conversion and sizes ------------------------------------------------------
    size_rows = []
    crec = {name: work / f"corpus-{name}.crec" for name in ("none", "zstd", "zstd-dict")}
    for name, path in crec.items():
        dt = min(convert(corpus, path, "--compress", name) for _ in range(2))
        size_rows.append(
            [
                f"JSONL -> .crec ({name})",
                f"{raw_mb / dt:.0f} MB/s",
                f"{path.stat().st_size / 1e6:.1f} MB",
            ]
        )
    ar_path = work / "corpus.array_record"
    t0 = time.perf_counter()
    w = ArrayRecordWriter(str(ar_path), "group_size:1")
    for line in lines:
        w.write(line)
    w.close()
    dt = time.perf_counter() - t0
    size_rows.append(
        [
            "ArrayRecordWriter('group_size:1') (seed 003)",
            f"{raw_mb / dt:.0f} MB/s",
            f"{ar_path.stat().st_size / 1e6:.1f} MB",
        ]
    )
    size_rows.insert(0, ["raw JSONL", "", f"{raw_mb:.1f} MB"])

    # -- random single-record reads on the corpus ---------------------------------
    rng = random.Random(0)
    idx = [rng.randrange(n) for _ in range(args.reads)]
    gidx = idx[: args.grain_reads]
    mm, offs, lens = bare_reader(crec["none"])
    on = RecordFileDataSource(crec["none"])
    off = RecordFileDataSource(crec["none"], verify_checksums=False)
    zd = RecordFileDataSource(crec["zstd-dict"])
    chute_ar = ArrayRecordDataSource(str(ar_path))
    chute_ar_reader = ArrayRecordDataSource(str(ar_path), direct=False)
    jsonl_raw = JsonlDataSource(corpus, decode=False)
    jsonl_dict = JsonlDataSource(corpus)
    grain_ar = grain.sources.ArrayRecordDataSource(str(ar_path)) if grain else chute_ar_reader
    assert on[idx[0]] == off[idx[0]] == zd[idx[0]] == chute_ar[idx[0]] == grain_ar[idx[0]]
    assert mm[offs[idx[1]] : offs[idx[1]] + lens[idx[1]]] == lines[idx[1]]
    for src in (
        on,
        zd,
        chute_ar,
        chute_ar_reader,
        jsonl_raw,
    ):  # warm the page cache and the readers
        for i in range(0, n, 7):
            src[i]

    print(f"# file leases: {lease_state(crec['none'])}")
    print(f"# CRC32C: {checksum.IMPLEMENTATION}\n")

    def bare() -> int:
        for i in idx:
            mm[offs[i] : offs[i] + lens[i]]
        return len(idx)

    fd = os.open(crec["none"], os.O_RDONLY)

    def size_check() -> int:
        lseek, end = os.lseek, os.SEEK_END
        for _ in idx:
            lseek(fd, 0, end)
        return len(idx)

    records = [mm[offs[i] : offs[i] + lens[i]] for i in idx[:10_000]] * (len(idx) // 10_000)

    def crc_alone() -> int:
        crc = checksum.crc32c
        for r in records:
            crc(r)
        return len(records)

    def loop(src: object, indices: list[int]):  # type: ignore[no-untyped-def]
        def run() -> int:
            get = src.__getitem__  # type: ignore[attr-defined]
            for i in indices:
                get(i)
            return len(indices)

        return run

    r = rates(
        {
            "bare": bare,
            "size_check": size_check,
            "crc": crc_alone,
            "crec": loop(on, idx),
            "crec_nocrc": loop(off, idx),
            "crec_zstd_dict": loop(zd, idx),
            "chute_ar": loop(chute_ar, idx),
            "chute_ar_reader": loop(chute_ar_reader, idx[:50_000]),
            "grain_ar": loop(grain_ar, gidx),
            "jsonl_raw": loop(jsonl_raw, idx[:100_000]),
            "jsonl_dict": loop(jsonl_dict, idx[:100_000]),
        },
        repeats=5,
    )
    rows = [
        ["bare mmap + offsets loop (limit)", f"{r['bare'] / 1e6:.2f} M rec/s", "", ""],
        [
            "the size check alone (os.lseek per read)",
            f"{1e9 / r['size_check']:.0f} ns/read",
            "",
            "",
        ],
        [
            "the CRC32C alone (one call on a record)",
            f"{1e9 / r['crc']:.0f} ns/read",
            "",
            "",
        ],
        [
            ".crec RecordFileDataSource[i], checksums on",
            f"{r['crec'] / 1e6:.2f} M rec/s",
            f"{r['crec'] / r['bare']:.2f}x bare",
            ">= 0.5x",
        ],
        [
            ".crec RecordFileDataSource[i], checksums off",
            f"{r['crec_nocrc'] / 1e6:.2f} M rec/s",
            f"{r['crec_nocrc'] / r['bare']:.2f}x bare",
            "",
        ],
        [
            ".crec zstd+dictionary, checksums on",
            f"{r['crec_zstd_dict'] / 1e6:.2f} M rec/s",
            f"{r['crec_zstd_dict'] / r['bare']:.2f}x bare",
            "",
        ],
        ["grain.sources.ArrayRecordDataSource[i]", f"{r['grain_ar'] / 1e3:.2f} k rec/s", "", ""],
        [
            "chute ArrayRecordDataSource[i] (direct, default)",
            f"{r['chute_ar'] / 1e3:.1f} k rec/s",
            f"{r['chute_ar'] / r['grain_ar']:.0f}x grain",
            ">= 50x",
        ],
        [
            "chute ArrayRecordDataSource(direct=False)[i]",
            f"{r['chute_ar_reader'] / 1e3:.1f} k rec/s",
            f"{r['chute_ar_reader'] / r['grain_ar']:.0f}x grain",
            "",
        ],
    ]
    rows += [
        [
            "JsonlDataSource(decode=False)[i] (line index)",
            f"{r['jsonl_raw'] / 1e6:.2f} M rec/s",
            f"{r['jsonl_raw'] / r['bare']:.2f}x bare",
            "",
        ],
        ["JsonlDataSource[i] (orjson dicts)", f"{r['jsonl_dict'] / 1e3:.0f} k rec/s", "", ""],
    ]
    batch = idx[:20_000]
    rb = rates(
        {
            "crec": lambda: len(on.__getitems__(batch)),
            "chute_ar": lambda: len(chute_ar.__getitems__(batch)),
            "grain_ar": lambda: len(grain_ar.__getitems__(batch)),
        }
    )
    rows += [
        [
            "__getitems__(20k random): .crec, checksums on",
            f"{rb['crec'] / 1e6:.2f} M rec/s",
            f"{rb['crec'] / r['bare']:.2f}x bare",
            "",
        ],
        [
            "__getitems__(20k random): grain ArrayRecord",
            f"{rb['grain_ar'] / 1e3:.1f} k rec/s",
            "",
            "",
        ],
        [
            "__getitems__(20k random): chute ArrayRecord",
            f"{rb['chute_ar'] / 1e3:.1f} k rec/s",
            f"{rb['chute_ar'] / rb['grain_ar']:.1f}x grain",
            "",
        ],
    ]

    # -- 100 KB records: gather into a reused buffer --------------------------------
    big_path = work / "big.crec"
    big_rng = np.random.default_rng(0)
    blob = big_rng.integers(0, 256, size=2_000 * 100_000 + 1_000, dtype=np.uint8).tobytes()
    sizes = big_rng.integers(90_000, 110_000, size=2_000)
    with RecordWriter(big_path) as bw:
        for k, s in enumerate(sizes):
            bw.write(blob[k * 100_000 : k * 100_000 + int(s)])
    big = RecordFileDataSource(big_path)
    big_off = RecordFileDataSource(big_path, verify_checksums=False)
    bmm, boffs, blens = bare_reader(big_path)
    order = [int(i) for i in big_rng.permutation(2_000)]
    batches = [order[k : k + 64] for k in range(0, 2_000, 64)]
    buf = np.empty(64 * 110_000, dtype=np.uint8)
    bview = memoryview(buf)
    total_bytes = int(sizes.sum())
    for b in batches:
        big.read_into(b, buf)

    def gather(src: RecordFileDataSource):  # type: ignore[no-untyped-def]
        def run() -> int:
            for b in batches:
                src.read_into(b, buf)
            return total_bytes

        return run

    def bare_gather() -> int:
        view = memoryview(bmm)
        for b in batches:
            pos = 0
            for i in b:
                o, ln = boffs[i], blens[i]
                bview[pos : pos + ln] = view[o : o + ln]
                pos += ln
        view.release()
        return total_bytes

    def single_big() -> int:
        for i in order:
            big[i]
        return total_bytes

    g = rates(
        {"bare": bare_gather, "on": gather(big), "off": gather(big_off), "single": single_big},
        repeats=5,
    )
    rows += [
        ["100 KB gather: bare copy loop into a buffer", f"{g['bare'] / 1e9:.2f} GB/s", "", ""],
        [
            "100 KB gather: read_into, checksums on",
            f"{g['on'] / 1e9:.2f} GB/s",
            f"{g['on'] / g['bare']:.2f}x bare",
            ">= 4 GB/s",
        ],
        [
            "100 KB gather: read_into, checksums off",
            f"{g['off'] / 1e9:.2f} GB/s",
            f"{g['off'] / g['bare']:.2f}x bare",
            "",
        ],
        [
            "100 KB random src[i] (new bytes each), checksums on",
            f"{g['single'] / 1e9:.2f} GB/s",
            "",
            "",
        ],
    ]
    os.close(fd)
    if grain is None:  # without grain its rows and ratios mean nothing
        rows = [[*r[:2], "", ""] if "grain" in r[2] else r for r in rows if "grain" not in r[0]]
    print(table(["random access", "rate", "vs", "target"], rows))
    print()
    print(table(["conversion and size", "throughput", "file size"], size_rows))


if __name__ == "__main__":
    main()
