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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import chute
from _harness import machine
from chute import sources
from chute.records import ShardedRecordWriter
from remote_helpers import TcpProxy

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
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    lines: list[str] = []
    try:
        _, port = server.get_host_and_port()
        with (
            tempfile.TemporaryDirectory() as tmp,
            TcpProxy(port, delay_s=args.latency_ms / 1000) as proxy,
        ):
            d = Path(tmp)
            os.environ["CHUTE_CACHE_DIR"] = str(d / "cache")
            _write(d, args.records, args.shards)
            direct = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
            import s3fs

            fs = s3fs.S3FileSystem(**direct)
            fs.mkdir("bench")
            fs.put(str(d / "crec") + "/", "bench/crec/", recursive=True)
            fs.put(str(d / "ar") + "/", "bench/ar/", recursive=True)
            opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}}
            size = sum(f.stat().st_size for f in (d / "crec").iterdir())
            contenders = {
                ".crec": (
                    sources.RecordFileDataSource(str(d / "crec")),
                    sources.RecordFileDataSource("s3://bench/crec", storage_options=opts),
                ),
                "ArrayRecord": (
                    sources.ArrayRecordDataSource(sorted(str(p) for p in (d / "ar").iterdir())),
                    sources.ArrayRecordDataSource("s3://bench/ar/*", storage_options=opts),
                ),
            }
            results: dict[tuple[str, str, str], list[float]] = {}
            for loc, rem in contenders.values():
                len(loc), len(rem)  # open and index outside the timing
            rng = np.random.default_rng(1)
            for r in range(args.rounds):
                batches = [
                    rng.integers(0, args.records, BATCH).tolist() for _ in range(args.batches)
                ]
                for fmt, (loc, rem) in contenders.items():
                    for where, src in (("local", loc), ("s3 +20ms", rem)):
                        for how in ("__getitems__", "pipeline"):
                            t0 = time.perf_counter()
                            if how == "__getitems__":
                                n = _getitems(src, batches)
                            else:
                                n = _pipeline(src, 100 + r, args.batches)
                            rate = n / (time.perf_counter() - t0)
                            results.setdefault((fmt, how, where), []).append(rate)
            lines.append(
                f"bench_remote: {args.records:,} records of 1 KiB in {args.shards} shards "
                f"(.crec {size / 1e6:.0f} MB; default block cache 128 MiB), random batches "
                f"of {BATCH}, {args.latency_ms:.0f} ms injected per request, "
                f"{args.rounds} rounds x {args.batches} batches, medians"
            )
            lines.append(f"machine: {machine()}; SHARED with other engineers' test runs")
            lines.append("")
            lines.append(
                f"{'format':<12} {'read':<14} {'local rec/s':>12} {'s3 rec/s':>12} {'s3/local':>9}"
            )
            for fmt in contenders:
                for how in ("__getitems__", "pipeline"):
                    lo = statistics.median(results[fmt, how, "local"])
                    re_ = statistics.median(results[fmt, how, "s3 +20ms"])
                    lines.append(f"{fmt:<12} {how:<14} {lo:>12,.0f} {re_:>12,.0f} {re_ / lo:>9.3f}")
    finally:
        server.stop()
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
