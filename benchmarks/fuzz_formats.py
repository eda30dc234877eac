"""Fuzzing chute's readers: a mutated file reads back right or raises chute.DataError.

For each format (`.crec` raw and zstd, ArrayRecord, TFRecord, JSONL, Parquet without and
with page CRCs, NumPy) one small valid file is written; each mutation (seeded: bit flips, byte overwrites,
truncation, appended garbage, zeroed, duplicated or removed ranges, 1 to 3 of them) is
written to a new file, opened with chute's source, and every record is read, one by one
and in one `__getitems__` block. The reads run in worker subprocesses, so a crash
(SIGBUS, SIGSEGV) is counted and the worker replaced, and a read that takes longer than
`--timeout` seconds is counted as a hang. Reported per format:

- `DataError`: mutations where some read raised `chute.DataError` (the expected outcome);
- `crashes`, `hangs`, `non-chute exc.`: the reader's faults;
- `wrong`: records returned that differ from every record written (corrupt content);
- `moved`: whole records returned at another index (a cut or copy exactly on record
  boundaries makes a well-formed file; only a file-level checksum can tell, and
  TFRecord, JSONL and NumPy have none).

Formats with checksums (`.crec`, ArrayRecord, TFRecord, Parquet written with
`write_page_checksum=True`) must show zero `wrong`.
Exit status 1 if any crash, hang or non-chute exception, or any `wrong` record of a
checksummed format.

    .venv/bin/python benchmarks/fuzz_formats.py [--mutations 2000] [--formats crec,jsonl]
        [--workers 2] [--seed 0] [--timeout 20] [--json]
    .venv/bin/python benchmarks/fuzz_formats.py --repro FORMAT SEED   # one case, in process
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import selectors
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

RECORDS = (
    [b"", b"x", b"a short record", b"text that compresses well, text that compresses " * 6]
    + [b"record %d: " % i + bytes(range(i % 7, 200, 3)) for i in range(36)]
    + [bytes(random.Random(7).randrange(256) for _ in range(700))]
)
ROWS = [
    {"i": i, "s": f"row {i} " * (i % 5), "f": i / 7, "l": list(range(i % 4))} for i in range(40)
]
CHECKSUMMED = {"crec", "crec-zstd", "arrayrecord", "tfrecord", "parquet-crc"}


def _masked_crc(data: bytes) -> int:
    import crc32c

    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _write(fmt: str, path: Path) -> None:
    if fmt.startswith("crec"):
        from chute.records import RecordWriter

        options: dict[str, Any] = {"compression": "zstd"} if fmt == "crec-zstd" else {}
        with RecordWriter(path, metadata={"k": 1}, **options) as w:
            for r in RECORDS:
                w.write(r)
    elif fmt == "arrayrecord":
        from array_record.python.array_record_module import ArrayRecordWriter

        aw = ArrayRecordWriter(str(path), "group_size:1")
        for r in RECORDS:
            aw.write(r)
        aw.close()
    elif fmt == "tfrecord":
        with open(path, "wb") as f:
            for r in RECORDS:
                head = struct.pack("<Q", len(r))
                f.write(head + struct.pack("<I", _masked_crc(head)))
                f.write(r + struct.pack("<I", _masked_crc(r)))
    elif fmt == "jsonl":
        with open(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in ROWS)
    elif fmt.startswith("parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        crc = fmt == "parquet-crc"
        pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=10, write_page_checksum=crc)
    elif fmt == "numpy":
        import numpy as np

        np.save(path, np.arange(40 * 6, dtype=np.float64).reshape(40, 6) / 3)
    else:
        raise ValueError(f"unknown format {fmt!r}")


def _open(fmt: str, path: Path) -> Any:
    from chute import sources

    p = str(path)
    if fmt.startswith("crec"):
        return sources.RecordFileDataSource(p)
    if fmt == "arrayrecord":
        return sources.ArrayRecordDataSource(p)
    if fmt == "tfrecord":
        return sources.TFRecordDataSource(p, cache_index=False)
    if fmt == "jsonl":
        return sources.JsonlDataSource(p, cache_index=False)
    if fmt.startswith("parquet"):
        return sources.ParquetDataSource(p)
    return sources.NumpyDataSource(p)


EXT = {
    "crec": ".crec",
    "crec-zstd": ".crec",
    "arrayrecord": ".array_record",
    "tfrecord": ".tfrecord",
    "jsonl": ".jsonl",
    "parquet": ".parquet",
    "parquet-crc": ".parquet",
    "numpy": ".npy",
}


def _key(value: Any) -> Any:
    """A comparable form of a record: bytes, a dict, or a NumPy row."""
    if hasattr(value, "tobytes") and hasattr(value, "dtype"):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return ("dict", json.dumps(value, sort_keys=True))
    return value


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    """1 to 3 random mutations of `data`, and their names."""
    buf = bytearray(data)
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        kind = rng.choice(["flip", "overwrite", "truncate", "append", "zero", "dup", "cut"])
        n = len(buf)
        pos = rng.randrange(max(n, 1))
        span = rng.choice([1, 2, 4, 8, 16, 64, 512, 4096])
        if kind == "flip" and n:
            for _ in range(rng.randint(1, 8)):
                buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
        elif kind == "overwrite" and n:
            buf[pos : pos + span] = rng.randbytes(len(buf[pos : pos + span]))
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "append":
            buf += rng.randbytes(rng.randint(1, 300))
        elif kind == "zero":
            buf[pos : pos + span] = bytes(len(buf[pos : pos + span]))
        elif kind == "dup":
            buf[rng.randrange(n + 1) : 0] = buf[pos : pos + span]
        elif kind == "cut":
            del buf[pos : pos + span]
        done.append(kind)
    return bytes(buf), done


class Case:
    """Reads one mutated file and classifies what happened."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.originals: dict[str, tuple[bytes, list[Any]]] = {}

    def original(self, fmt: str) -> tuple[bytes, list[Any]]:
        if fmt not in self.originals:
            path = self.workdir / f"original-{fmt}{EXT[fmt]}"
            _write(fmt, path)
            src = _open(fmt, path)
            expected = [_key(src[i]) for i in range(len(src))]
            self.originals[fmt] = (path.read_bytes(), expected)
        return self.originals[fmt]

    def run(self, fmt: str, seed: int) -> dict[str, Any]:
        from chute import DataError

        data, expected = self.original(fmt)
        mutated, kinds = mutate(data, random.Random(f"{fmt}:{seed}"))
        sub = self.workdir / f"m{seed}"
        sub.mkdir()
        path = sub / f"f{EXT[fmt]}"
        path.write_bytes(mutated)
        result: dict[str, Any] = {"mutations": kinds, "errors": 0, "wrong": 0, "moved": 0}
        known = {k: i for i, k in enumerate(expected)}

        def check(i: int, value: Any) -> None:
            k = _key(value)
            if i < len(expected) and k == expected[i]:
                return
            where = known.get(k)
            field = "moved" if where is not None else "wrong"
            result[field] += 1
            result.setdefault("example", f"record {i}: got {str(value)[:60]}")

        def attempt(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except DataError:
                result["errors"] += 1
            except Exception as e:
                result["other"] = f"{type(e).__name__}: {str(e)[:200]}"
            return None

        try:
            src = attempt(lambda: _open(fmt, path))
            n = attempt(lambda: len(src)) if src is not None else None
            if n is not None:
                for i in range(n):
                    value = attempt(lambda i=i: src[i])
                    if value is not None:
                        check(i, value)
                values = attempt(lambda: src.__getitems__(list(range(n))))
                for i, value in enumerate(values or []):
                    check(i, value)
        finally:
            shutil.rmtree(sub, ignore_errors=True)
        return result


def worker() -> None:
    """Reads `{"format", "seed"}` lines from stdin; writes one JSON result line each."""
    import warnings

    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="chute-fuzz-") as d:
        case = Case(Path(d))
        for line in sys.stdin:
            job = json.loads(line)
            out = case.run(job["format"], job["seed"])
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()


class Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)

    def ask(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"crash": self.proc.wait()}
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                self.kill()
                return {"hang": True}
            line = self.proc.stdout.readline()
            if line:
                return dict(json.loads(line))
            return {"crash": self.proc.wait()}

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        self.sel.close()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self.proc.wait()


def fuzz(
    formats: list[str], mutations: int, seed: int, workers: int, timeout: float
) -> dict[str, dict[str, Any]]:
    jobs: queue.Queue[tuple[str, int]] = queue.Queue()
    for k in range(mutations):
        for fmt in formats:
            jobs.put((fmt, seed + k))
    stats = {fmt: Counter[str]() for fmt in formats}
    examples: dict[str, list[str]] = {fmt: [] for fmt in formats}
    lock = threading.Lock()
    # The first job of a fresh worker also pays for its imports: allow for that.
    first_timeout = timeout + 60

    def run() -> None:
        w = Worker()
        fresh = True
        while True:
            try:
                fmt, s = jobs.get_nowait()
            except queue.Empty:
                break
            out = w.ask({"format": fmt, "seed": s}, first_timeout if fresh else timeout)
            fresh = False
            with lock:
                st = stats[fmt]
                st["mutations"] += 1
                if "crash" in out or "hang" in out:
                    kind = "crashes" if "crash" in out else "hangs"
                    st[kind] += 1
                    what = f"signal {-out['crash']}" if "crash" in out else "no answer"
                    examples[fmt].append(f"{kind[:-1]} ({what}): --repro {fmt} {s}")
                    w = Worker()
                    fresh = True
                    continue
                st["dataerror"] += bool(out["errors"])
                st["other"] += "other" in out
                st["wrong"] += out["wrong"]
                st["moved"] += out["moved"]
                if "other" in out or out["wrong"]:
                    detail = out.get("other") or out.get("example")
                    examples[fmt].append(f"{detail} ({out['mutations']}): --repro {fmt} {s}")
        w.close()

    threads = [threading.Thread(target=run) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {fmt: {**stats[fmt], "examples": examples[fmt][:5]} for fmt in formats}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mutations", type=int, default=2000, help="mutated files per format")
    p.add_argument("--formats", default=",".join(EXT))
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--seed", type=int, default=0, help="seed of the first mutation")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds before a hang")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--repro", nargs=2, metavar=("FORMAT", "SEED"))
    args = p.parse_args()
    if args.worker:
        worker()
        return
    if args.repro:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(Case(Path(d)).run(args.repro[0], int(args.repro[1])), indent=1))
        return
    formats = args.formats.split(",")
    for fmt in formats:
        if fmt not in EXT:
            p.error(f"unknown format {fmt!r}; choose from {', '.join(EXT)}")
    t0 = time.perf_counter()
    results = fuzz(formats, args.mutations, args.seed, args.workers, args.timeout)
    elapsed = time.perf_counter() - t0
    bad = any(
        r.get("crashes")
        or r.get("hangs")
        or r.get("other")
        or (fmt in CHECKSUMMED and r.get("wrong"))
        for fmt, r in results.items()
    )
    if args.json:
        print(json.dumps(results))
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from _harness import machine, table

        print(f"# {machine()}")
        print(
            f"# {args.mutations} mutations per format from seed {args.seed}, "
            f"{args.workers} worker processes, {elapsed:.0f} s\n"
        )
        cols = ["mutations", "dataerror", "crashes", "hangs", "other", "wrong", "moved"]
        rows = [
            [fmt + (" (checksums)" if fmt in CHECKSUMMED else "")]
            + [str(results[fmt].get(c, 0)) for c in cols]
            for fmt in formats
        ]
        head = ["format", "mutations", "DataError", "crashes", "hangs", "non-chute exc."]
        print(table([*head, "wrong records", "moved records"], rows))
        for fmt in formats:
            for line in results[fmt]["examples"]:
                print(f"  {fmt}: {line}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
