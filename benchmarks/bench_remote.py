"""Random reads of `.crec` and ArrayRecord records from a local S3 server (moto) with
20 ms per request injected by an asyncio TCP proxy in front of it, against the same reads
from local disk, in one run.

Batches of 512 random indices, read (a) through the source's `__getitems__` and (b)
through a pipeline `MapDataset.source(src).shuffle(seed).to_iter_dataset().batch(512)`
with default settings. The dataset (sharded, 1 KiB records) is larger than the default
block cache (128 MiB). Rounds alternate local and remote; medians reported.

    python benchmarks/bench_remote.py [--records N] [--rounds R] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import chute
from _harness import machine
from chute import sources
from chute.records import ShardedRecordWriter

BATCH = 512


def _write(d: Path, n: int, shards: int) -> None:
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 255, size=(n, 1024), dtype=np.uint8)
    with ShardedRecordWriter(d / "crec", records_per_shard=n // shards) as w:
        for row in payload:
            w.write(row.tobytes())
    from array_record.python import array_record_module

    (d / "ar").mkdir()
    per = n // shards
    for s in range(shards):
        aw = array_record_module.ArrayRecordWriter(
            str(d / "ar" / f"part-{s:05d}.array_record"), "group_size:1,uncompressed"
        )
        for row in payload[s * per : (s + 1) * per]:
            aw.write(row.tobytes())
        aw.close()


def _getitems(src: Any, batches: list[list[int]]) -> int:
    n = 0
    for b in batches:
        n += len(src.__getitems__(b))
    return n


def _pipeline(src: Any, seed: int, nbatches: int) -> int:
    it = iter(chute.MapDataset.source(src).shuffle(seed=seed).to_iter_dataset().batch(BATCH))
    n = 0
    for _ in range(nbatches):
        n += len(next(it))
    it.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=160_000)
    ap.add_argument("--shards", type=int, default=40)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    # The server and the proxy run in a process of their own (tests/remote_helpers.py), so
    # their Python work does not compete for this process's GIL.
    helper = Path(__file__).resolve().parents[1] / "tests" / "remote_helpers.py"
    server = subprocess.Popen(
        [sys.executable, str(helper), str(args.latency_ms), "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    port, proxy_port, plain_port = map(int, server.stdout.readline().split())
    lines: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            os.environ["CHUTE_CACHE_DIR"] = str(d / "cache")
            _write(d, args.records, args.shards)
            direct = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
            import s3fs

            fs = s3fs.S3FileSystem(**direct)
            fs.mkdir("bench")
            fs.put(str(d / "crec") + "/", "bench/crec/", recursive=True)
            fs.put(str(d / "ar") + "/", "bench/ar/", recursive=True)
            opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy_port}"}}
            # The same server through a proxy that adds no latency: what the server and the
            # client can serve at all; 20 ms / 0 ms shows how much latency is hidden.
            plain = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{plain_port}"}}
            size = sum(f.stat().st_size for f in (d / "crec").iterdir())
            contenders = {
                ".crec": {
                    "local": sources.RecordFileDataSource(str(d / "crec")),
                    "s3 +0ms": sources.RecordFileDataSource(
                        "s3://bench/crec", storage_options=plain
                    ),
                    "s3 +20ms": sources.RecordFileDataSource(
                        "s3://bench/crec", storage_options=opts
                    ),
                },
                "ArrayRecord": {
                    "local": sources.ArrayRecordDataSource(
                        sorted(str(p) for p in (d / "ar").iterdir())
                    ),
                    "s3 +0ms": sources.ArrayRecordDataSource(
                        "s3://bench/ar/*", storage_options=plain
                    ),
                    "s3 +20ms": sources.ArrayRecordDataSource(
                        "s3://bench/ar/*", storage_options=opts
                    ),
                },
            }
            wheres = ("local", "s3 +0ms", "s3 +20ms")
            results: dict[tuple[str, str, str], list[float]] = {}
            for group in contenders.values():
                for src in group.values():
                    len(src)  # open and index outside the timing
            rng = np.random.default_rng(1)
            for r in range(args.rounds):
                for fmt, group in contenders.items():
                    for k, where in enumerate(wheres):
                        src = group[where]
                        for how in ("__getitems__", "pipeline"):
                            # Each contender draws its own indices: none reads blocks that
                            # another one just fetched into the shared block cache.
                            t0 = time.perf_counter()
                            if how == "__getitems__":
                                batches = [
                                    rng.integers(0, args.records, BATCH).tolist()
                                    for _ in range(args.batches)
                                ]
                                t0 = time.perf_counter()
                                n = _getitems(src, batches)
                            else:
                                n = _pipeline(src, 1000 * r + 10 * k, args.batches)
                            rate = n / (time.perf_counter() - t0)
                            results.setdefault((fmt, how, where), []).append(rate)
                            print(
                                f"round {r}: {fmt} {how} {where}: {rate:,.0f} rec/s",
                                file=sys.stderr,
                                flush=True,
                            )
            lines.append(
                f"bench_remote: {args.records:,} records of 1 KiB in {args.shards} shards "
                f"(.crec {size / 1e6:.0f} MB, more than the default 128 MiB block cache), "
                f"random batches of {BATCH}, {args.rounds} rounds x {args.batches} batches "
                "per contender, contenders alternated, medians"
            )
            lines.append(
                "moto S3 server and latency proxies in a separate process; 's3 +20ms' adds "
                f"{args.latency_ms:.0f} ms to every request, 's3 +0ms' is the same server "
                "with no added latency"
            )
            lines.append(f"machine: {machine()}; SHARED with other engineers' test runs")
            lines.append("")
            lines.append(
                f"{'format':<12} {'read':<13} {'local rec/s':>11} {'s3+0ms':>8} {'s3+20ms':>8} "
                f"{'20ms/local':>10} {'20ms/0ms':>8}"
            )
            for fmt in contenders:
                for how in ("__getitems__", "pipeline"):
                    lo, zero, slow = (statistics.median(results[fmt, how, w]) for w in wheres)
                    lines.append(
                        f"{fmt:<12} {how:<13} {lo:>11,.0f} {zero:>8,.0f} {slow:>8,.0f} "
                        f"{slow / lo:>10.3f} {slow / zero:>8.2f}"
                    )
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
