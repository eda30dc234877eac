""".crec random reads with checksums, per CRC32C implementation, as a ratio to a bare mmap loop.

`bench_storage.py` times each contender as the best of five runs of 200k reads, which a
busy machine skews by tens of percent. This script measures its one ratio, single-record
`RecordFileDataSource[i]` with checksums on against a bare mmap + offsets loop over the
same file, so that load can hardly move it: it counts the CPU time of the reading thread
(`time.thread_time_ns`: time spent waiting for a core does not count), and a child
process alternates the contenders in bursts of `--burst` reads (the same indices for
each, the order flipped every round) and reports the median, over `--rounds` rounds, of
the per-round ratio. Children run one after the
other, round robin over the CRC32C code they use (`CHUTE_CRC32C`: `auto` is the native
extension when built, `package` the crc32c package), `--repeats` times; with
`--before-src DIR` also a checkout of older code (its `src`), to compare with what came
before. The corpus is ../shared/data/make_corpus.py's (120k records of ~200 bytes).

    .venv/bin/python benchmarks/bench_crc.py [--records 120000] [--before-src DIR]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import machine, shared_data, table

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"


def child(path: str, rounds: int, burst: int) -> None:
    """Runs in a child process: prints the timings of one implementation as JSON."""
    from chute.sources import RecordFileDataSource

    try:
        from chute._src.storage.records.checksum import IMPLEMENTATION, crc32c
    except ImportError:  # code from before the checksum module
        from crc32c import crc32c

        IMPLEMENTATION = "crc32c package (code before the checksum module)"
    on = RecordFileDataSource(path)
    off = RecordFileDataSource(path, verify_checksums=False)
    n = len(on)
    f = on._open()[0]
    offs, lens = list(f.offsets), list(f.lengths)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    rng = random.Random(0)
    idx = [rng.randrange(n) for _ in range(burst)]
    records = [mm[offs[i] : offs[i] + lens[i]] for i in idx]

    def bare() -> None:
        for i in idx:
            mm[offs[i] : offs[i] + lens[i]]

    def crec() -> None:
        get = on.__getitem__
        for i in idx:
            get(i)

    def crec_nocrc() -> None:
        get = off.__getitem__
        for i in idx:
            get(i)

    def crc_alone() -> None:
        for r in records:
            crc32c(r)

    runs = {"bare": bare, "crec": crec, "crec_nocrc": crec_nocrc, "crc": crc_alone}
    for run in runs.values():  # warm up
        run()
    ns: dict[str, list[float]] = {name: [] for name in runs}
    for k in range(rounds):
        order = list(runs.items()) if k % 2 == 0 else list(runs.items())[::-1]
        for name, run in order:
            t0 = time.thread_time_ns()
            run()
            ns[name].append((time.thread_time_ns() - t0) / burst)
    ratio = [b / c for b, c in zip(ns["bare"], ns["crec"])]
    ratio_off = [b / c for b, c in zip(ns["bare"], ns["crec_nocrc"])]
    print(
        json.dumps(
            {
                "implementation": IMPLEMENTATION,
                "ratio": statistics.median(ratio),
                "ratio_nocrc": statistics.median(ratio_off),
                "ns": {name: statistics.median(v) for name, v in ns.items()},
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=120_000)
    p.add_argument("--rounds", type=int, default=40, help="bursts per contender per child")
    p.add_argument("--burst", type=int, default=10_000, help="reads per burst")
    p.add_argument("--repeats", type=int, default=3, help="child runs per implementation")
    p.add_argument("--before-src", type=Path, default=None, help="older code's src/ to compare")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.rounds, args.burst)
        return
    from chute.records import RecordWriter

    work = args.workdir or Path(tempfile.mkdtemp(prefix="chute-bench-crc-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.jsonl"
    if not corpus.exists():
        make = shared_data() / "make_corpus.py"
        subprocess.run([sys.executable, str(make), str(corpus), str(args.records)], check=True)
    path = work / "corpus.crec"
    with RecordWriter(path) as w:
        for line in corpus.read_bytes().splitlines():
            w.write(line)
    contenders = {"native (auto)": (SRC, "auto"), "crc32c package": (SRC, "package")}
    if args.before_src is not None:
        contenders["before"] = (args.before_src.resolve(), "auto")
    print(f"# {machine()}")
    print(f"# {path}: random single-record reads, {args.rounds} bursts of {args.burst}")
    print(f"# load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)\n")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    rows = []
    for rep in range(args.repeats):
        for name, (src, setting) in contenders.items():
            env = {**os.environ, "PYTHONPATH": str(src), "CHUTE_CRC32C": setting}
            argv = [sys.executable, __file__, "--child", str(path)]
            argv += ["--rounds", str(args.rounds), "--burst", str(args.burst)]
            out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
            r = json.loads(out.stdout)
            results[name].append(r)
            ns = r["ns"]
            rows.append(
                [
                    f"{name} #{rep + 1}",
                    r["implementation"],
                    f"{ns['bare']:.0f}",
                    f"{ns['crc']:.0f}",
                    f"{ns['crec']:.0f}",
                    f"{r['ratio']:.2f}x",
                    f"{r['ratio_nocrc']:.2f}x",
                ]
            )
    heads = ["run", "CRC32C code", "bare ns", "CRC ns", "crec[i] ns", "crec/bare", "nocrc/bare"]
    print(table(heads, rows))
    print()
    summary = []
    for name, rs in results.items():
        med = statistics.median
        summary.append(
            [
                name,
                f"{med(r['ns']['crc'] for r in rs):.0f} ns",
                f"{med(r['ratio'] for r in rs):.2f}x bare",
                f"{med(r['ratio_nocrc'] for r in rs):.2f}x bare",
                ">= 0.5x",
            ]
        )
    print(
        table(
            ["median of runs", "CRC call", "crec[i], checksums on", "checksums off", "target"],
            summary,
        )
    )


if __name__ == "__main__":
    main()
