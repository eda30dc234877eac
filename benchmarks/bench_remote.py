"""Random reads of `.crec` and ArrayRecord records from a local S3 server (moto) with
20 ms per request injected by an asyncio TCP proxy in front of it, against the same reads
from local disk, in one run.

The block cache is sized from the machine's memory (an eighth of what is available) and
holds this dataset (268 MB at the defaults): a read that misses then fetches its whole
object, kept whole, as the page cache keeps a local file. Every contender starts from an
empty cache of that size (a fresh one swapped in), so each one's first batches fetch
what they need; the steady-state part adds a row with the cache set to 128 MiB, half the
data (where reads go by 32 KiB blocks), and one with no cache.

First batches: batches of 512 random indices, read (a) through the source's
`__getitems__` and (b) through a pipeline
`MapDataset.source(src).shuffle(seed).to_iter_dataset().batch(512)` with default settings
from a fresh iterator, (c) the same pipeline with 16 threads reading ahead, and (d) with
256 elements ahead from the start (what a source's `reads_in_flight` asks for). The
dataset is sharded, of 1 KiB records. Rounds alternate local and remote; medians
reported.

Steady state: the default pipeline over `.crec`, then over ArrayRecord (`--steady-formats`),
from a fresh iterator per contender, its first batches timed apart, then `--steady-s` seconds of batches: local disk, and the
keep-alive range server at 20 ms with the default block cache, with a 128 MiB one and with
none (a 0-byte cache swapped in: what `CHUTE_REMOTE_CACHE_BYTES=0` gives), with the share
of record reads the cache served and the CPU per record of the client and of the server
process.

With `--calls`, only obstore's ways to send a batch of range requests are compared (the
client's CPU per range): chute's capped stream per range, `get_range_async` per range and
`get_ranges_async` per object, which buffer each answer's body whole.

    python benchmarks/bench_remote.py [--records N] [--rounds R] [--steady-formats .crec,ArrayRecord]
        [--calls] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import chute
from _harness import dummy_s3_credentials, emit, machine, object_servers
from chute import sources
from chute._src.storage.remote import blocks
from chute.records import ShardedRecordWriter

BATCH = 512
HOWS = ("__getitems__", "pipeline", "pipeline 16t", "pipeline b256")
# 'pipeline 16t': the same pipeline with read-ahead set by hand (16 threads, 1024 elements
# ahead), to tell the reads apart from AUTOTUNE's ramp from 2 threads and 32 elements.
# 'pipeline b256': AUTOTUNE threads, 256 elements ahead from the start: the start a remote
# source's `reads_in_flight` (256) asks the executor for (here fixed: no buffer climb).
OPTIONS = {
    "pipeline": None,
    "pipeline 16t": chute.ReadOptions(num_threads=16, prefetch_buffer_size=1024),
    "pipeline b256": chute.ReadOptions(prefetch_buffer_size=256),
}


class CountingCache(blocks.BlockCache):
    """The block cache, counting the lookups it served (a lookup: a block, an object kept
    whole, or all the blocks of a batch at once)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes)
        self.hits = self.lookups = 0

    def get(self, key: Any) -> bytes | None:
        block = super().get(key)
        self.lookups += 1
        self.hits += block is not None
        return block

    def get_many(self, keys: list[Any]) -> list[bytes] | None:
        got = super().get_many(keys)
        self.lookups += 1
        self.hits += got is not None
        return got


def _use_cache(store: blocks.BlockCache) -> None:
    blocks._cache = store  # the process's cache, as blocks.cache() makes it at first use


def _close(it: Any) -> None:
    """Closes a pipeline's iterator, then waits for the chunks its reader threads were
    computing: they finish after `close()`, and would overlap the next contender (or meet
    a stopped server at the end)."""
    it.close()
    for t in threading.enumerate():
        if t.name.startswith("chute-read"):
            t.join(timeout=60)


def _server_cpu_s() -> float:
    """CPU seconds used so far by this process's children (the servers' process)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for task in os.listdir("/proc/self/task"):
        try:  # a reader thread may end meanwhile
            with open(f"/proc/self/task/{task}/children") as f:
                pids = f.read().split()
        except FileNotFoundError:
            continue
        for pid in pids:
            with open(f"/proc/{pid}/stat") as g:
                fields = g.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _write(d: Path, n: int, shards: int) -> None:
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 255, size=(n, 1024), dtype=np.uint8)
    with ShardedRecordWriter(d / "crec", records_per_shard=n // shards) as w:
        for row in payload:
            w.write(row.tobytes())
    from array_record.python import array_record_module

    (d / "ar").mkdir(parents=True)
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


def _pipeline(src: Any, seed: int, nbatches: int, options: Any = None) -> int:
    ds = chute.MapDataset.source(src).shuffle(seed=seed).to_iter_dataset(options)
    it = iter(ds.batch(BATCH))
    n = 0
    for _ in range(nbatches):
        n += len(next(it))
    _close(it)
    return n


def _steady(src: Any, seed: int, first: int, seconds: float) -> dict[str, float]:
    """A fresh default pipeline: the rate of its `first` batches, then of `seconds` of
    batches, with the client's and the server's CPU per record over those."""
    # Repeated: a fast contender does not run out of records before `seconds` are up.
    ds = chute.MapDataset.source(src).shuffle(seed=seed).repeat().to_iter_dataset()
    it = iter(ds.batch(BATCH))
    t0 = time.perf_counter()
    for _ in range(first):
        next(it)
    t1, c1, s1 = time.perf_counter(), time.process_time(), _server_cpu_s()
    n = 0
    while time.perf_counter() - t1 < seconds:
        n += len(next(it))
    t2, c2, s2 = time.perf_counter(), time.process_time(), _server_cpu_s()
    _close(it)
    return {
        "first": first * BATCH / (t1 - t0),
        "steady": n / (t2 - t1),
        "client_us": 1e6 * (c2 - c1) / n,
        "server_us": 1e6 * (s2 - s1) / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=256_000)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--first", type=int, default=4, help="steady state: batches timed apart")
    ap.add_argument("--steady-s", type=float, default=10.0, help="steady state: seconds")
    ap.add_argument("--steady-rounds", type=int, default=3)
    ap.add_argument(
        "--steady-formats",
        type=lambda v: v.split(","),
        default=[".crec", "ArrayRecord"],
        help="steady state: the formats, comma-separated",
    )
    ap.add_argument(
        "--calls",
        action="store_true",
        help="only compare obstore's ways to send range requests (client CPU per request)",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    dummy_s3_credentials()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.environ["CHUTE_CACHE_DIR"] = str(d / "cache")
        root = d / "served"
        _write(root / "bench", args.records, args.shards)
        # moto, a latency proxy in front of it, and the range server (with and without
        # added latency) run in a process of their own (tests/remote_helpers.py), so their
        # Python work does not compete for this process's GIL.
        with object_servers(root, [args.latency_ms, 0]) as ports:
            if args.calls:
                lines = _calls(args, root / "bench", ports[-1])
            else:
                lines = _run(args, root / "bench", *ports)
    emit(lines, args.out)


def _calls(args: argparse.Namespace, d: Path, port: int) -> list[str]:
    """Batches of 512 random 1 KiB ranges across the `.crec` shards, sent to the range
    server at 0 ms three ways through obstore, alternated: chute's (`fetch.read_ranges`:
    each range one request, its answer read as a stream that stops at the bytes asked
    for), `get_range_async` per range and `get_ranges_async` per object (obstore's own
    coalescing: ranges up to 1 MiB apart merged), both of which buffer each answer's body
    whole, whatever size the server claims. Client CPU per range, this process's."""
    import asyncio

    import obstore

    from chute._src.storage.remote import fetch, stores

    names = sorted(p.name for p in (d / "crec").iterdir() if p.suffix == ".crec")
    opts = _endpoint(port)
    locs = [stores.located(f"s3://bench/crec/{n}", opts) for n in names]
    sizes = [(d / "crec" / n).stat().st_size for n in names]
    idents = [fetch.head(loc) for loc in locs if loc is not None]
    rng = np.random.default_rng(2)
    loop = asyncio.new_event_loop()

    def ranges() -> list[tuple[int, int, int]]:
        out = []
        for _ in range(BATCH):
            k = int(rng.integers(len(locs)))
            a = int(rng.integers(sizes[k] - 1024))
            out.append((k, a, a + 1024))
        return out

    def chute_way(rs: list[tuple[int, int, int]]) -> None:
        got = fetch.read_ranges([(locs[k], a, b, idents[k]) for k, a, b in rs])
        assert all(isinstance(g, bytes) for g in got)

    async def each(rs: list[tuple[int, int, int]]) -> list[Any]:
        return await asyncio.gather(
            *(
                obstore.get_range_async(locs[k].store, locs[k].path, start=a, end=b)
                for k, a, b in rs
            )
        )

    async def per_object(rs: list[tuple[int, int, int]]) -> list[Any]:
        by: dict[int, list[tuple[int, int]]] = {}
        for k, a, b in rs:
            by.setdefault(k, []).append((a, b))
        return await asyncio.gather(
            *(
                obstore.get_ranges_async(
                    locs[k].store, locs[k].path, starts=[a for a, _ in r], ends=[b for _, b in r]
                )
                for k, r in by.items()
            )
        )

    ways: dict[str, Any] = {
        "chute: a capped stream per range": chute_way,
        "get_range_async per range": lambda rs: loop.run_until_complete(each(rs)),
        "get_ranges_async per object": lambda rs: loop.run_until_complete(per_object(rs)),
    }
    rates: dict[str, list[float]] = {w: [] for w in ways}
    cpu: dict[str, list[float]] = {w: [] for w in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            way(ranges())  # warm: connections open
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.batches):
                way(ranges())
            n = BATCH * args.batches
            rates[name].append(n / (time.perf_counter() - t0))
            cpu[name].append(1e6 * (time.process_time() - c0) / n)
    lines = [
        f"bench_remote --calls: batches of {BATCH} random 1 KiB ranges across "
        f"{len(locs)} .crec shards of {sizes[0] / 1e6:.1f} MB on the keep-alive range "
        f"server at 0 ms (S3 requests, signed), {args.rounds} rounds x {args.batches} "
        "batches, ways alternated, medians; client CPU: this process's, per range",
        f"machine: {machine()}; load average {os.getloadavg()[0]:.1f} (a shared machine)",
        "",
        f"{'way':<36} {'ranges/s':>9} {'client us':>10}  body of an answer",
    ]
    bodies = {
        "chute: a capped stream per range": "read up to the range asked for",
        "get_range_async per range": "buffered whole (no bound)",
        "get_ranges_async per object": "buffered whole (no bound; merged ranges)",
    }
    for name in ways:
        rate, us = statistics.median(rates[name]), statistics.median(cpu[name])
        lines.append(f"{name:<36} {rate:>9,.0f} {us:>10,.0f}  {bodies[name]}")
    return lines


def _endpoint(port: int) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}


def _run(
    args: argparse.Namespace,
    d: Path,
    moto: int,
    moto_slow: int,
    _moto_fast: int,
    range_slow: int,
    range_fast: int,
) -> list[str]:
    import s3fs

    fs = s3fs.S3FileSystem(**_endpoint(moto))
    fs.mkdir("bench")
    fs.put(str(d / "crec") + "/", "bench/crec/", recursive=True)
    fs.put(str(d / "ar") + "/", "bench/ar/", recursive=True)
    size = sum(f.stat().st_size for f in (d / "crec").iterdir())
    ar_size = sum(f.stat().st_size for f in (d / "ar").iterdir())
    ar_names = sorted(p.name for p in (d / "ar").iterdir())
    ms = f"{args.latency_ms:.0f}ms"
    where = {
        f"moto +{ms}": _endpoint(moto_slow),
        "fast +0ms": _endpoint(range_fast),
        f"fast +{ms}": _endpoint(range_slow),
    }
    contenders: dict[str, dict[str, Any]] = {
        ".crec": {"local": sources.RecordFileDataSource(str(d / "crec"))},
        "ArrayRecord": {
            "local": sources.ArrayRecordDataSource([str(d / "ar" / n) for n in ar_names])
        },
    }
    for name, opts in where.items():
        contenders[".crec"][name] = sources.RecordFileDataSource(
            "s3://bench/crec", storage_options=opts
        )
        contenders["ArrayRecord"][name] = sources.ArrayRecordDataSource(
            [f"s3://bench/ar/{n}" for n in ar_names], storage_options=opts
        )
    wheres = ["local", *where]
    results: dict[tuple[str, str, str], list[float]] = {}
    cpu: dict[tuple[str, str, str], list[float]] = {}
    per = args.records // args.shards
    for group in contenders.values():
        for src in group.values():  # open and index every shard outside the timing
            src.__getitems__([k * per for k in range(args.shards)])
    rng = np.random.default_rng(1)
    for r in range(args.rounds):
        for fmt, group in contenders.items():
            for k, w in enumerate(wheres):
                for how in HOWS:
                    # Each contender draws its own indices, from an empty block cache.
                    _use_cache(blocks.BlockCache(blocks.default_cache_bytes()))
                    if how == "__getitems__":
                        batches = [
                            rng.integers(0, args.records, BATCH).tolist()
                            for _ in range(args.batches)
                        ]
                        t0, c0 = time.perf_counter(), time.process_time()
                        n = _getitems(group[w], batches)
                    else:
                        options = OPTIONS[how]
                        seed = 1000 * r + 10 * k + HOWS.index(how)  # no two rows read the same
                        t0, c0 = time.perf_counter(), time.process_time()
                        n = _pipeline(group[w], seed, args.batches, options)
                    rate = n / (time.perf_counter() - t0)
                    results.setdefault((fmt, how, w), []).append(rate)
                    # This process's CPU time per record (all its threads: the client's).
                    cpu.setdefault((fmt, how, w), []).append((time.process_time() - c0) / n)
                    print(f"round {r}: {fmt} {how} {w}: {rate:,.0f} rec/s", file=sys.stderr)
    lines = [
        f"bench_remote: {args.records:,} records of 1 KiB in {args.shards} shards (.crec "
        f"{size / 1e6:.0f} MB; the default block cache, {blocks.default_cache_bytes() >> 20:,} "
        "MiB, holds it: objects are fetched whole; every contender starts with it empty), "
        "random batches of "
        f"{BATCH}, {args.rounds} rounds x {args.batches} batches per contender, contenders "
        "alternated, medians; default settings everywhere",
        f"'moto +{ms}': moto's S3 server behind a proxy adding {ms} per request; moto closes "
        "the connection after every answer and runs a thread per request, so it serves a few "
        "hundred requests/s on this machine",
        f"'fast +0ms' / 'fast +{ms}': a minimal keep-alive range server (tests/remote_helpers.py"
        f" RangeServer) answering S3 GET/HEAD, with 0 and {ms} added per request: what the "
        "client side does when the server is not the limit",
        "'pipeline' runs MapDataset.source(src).shuffle(seed).to_iter_dataset().batch(512) "
        "from a fresh iterator (AUTOTUNE read options, ramping up from 2 threads and 32 "
        "elements ahead); 'pipeline 16t' the same with ReadOptions(num_threads=16, "
        "prefetch_buffer_size=1024); 'pipeline b256' with ReadOptions(prefetch_buffer_size=256)"
        " (AUTOTUNE threads, 256 elements ahead from the start, as a source's reads_in_flight "
        "asks; fixed here, no buffer climb)",
        "servers run in a process of their own",
        f"machine: {machine()}; SHARED with other engineers' test runs (load varied)",
        "",
        "records/s (and, after, the client's CPU microseconds per record)",
        f"{'format':<12} {'read':<13} " + " ".join(f"{w:>17}" for w in wheres) + "   vs local",
    ]
    for fmt in contenders:
        for how in HOWS:
            med = [statistics.median(results[fmt, how, w]) for w in wheres]
            us = [statistics.median(cpu[fmt, how, w]) * 1e6 for w in wheres]
            fracs = " ".join(f"{m / med[0]:.3f}" for m in med[1:])
            cells = " ".join(f"{f'{m:,.0f} ({u:,.0f})':>17}" for m, u in zip(med, us))
            lines.append(f"{fmt:<12} {how:<13} {cells}   {fracs}")
    for fmt, fmt_size in ((".crec", size), ("ArrayRecord", ar_size)):
        if fmt in args.steady_formats:
            lines += ["", *_steady_state(args, contenders[fmt], f"fast +{ms}", fmt, fmt_size)]
    return lines


def _steady_state(
    args: argparse.Namespace, group: dict[str, Any], remote: str, fmt: str, size: int
) -> list[str]:
    default_bytes = blocks.default_cache_bytes()  # what CHUTE_REMOTE_CACHE_BYTES unset gives
    sizes = {"cache": default_bytes, "128 MiB cache": 128 << 20, "no cache": 0}
    rows = {
        "local": ("local", None),
        f"{remote}": (remote, "cache"),
        f"{remote}, 128 MiB cache": (remote, "128 MiB cache"),
        f"{remote}, no cache": (remote, "no cache"),
    }
    got: dict[str, list[dict[str, float]]] = {}
    served: dict[str, list[float]] = {}
    for r in range(args.steady_rounds):
        for k, (name, (where, cache)) in enumerate(rows.items()):
            if cache is not None:
                store = CountingCache(sizes[cache])  # empty: the contender fetches its data
                _use_cache(store)
                hits, lookups = store.hits, store.lookups
            m = _steady(group[where], 7000 + 10 * r + k, args.first, args.steady_s)
            got.setdefault(name, []).append(m)
            if cache is not None:
                share = (store.hits - hits) / max(1, store.lookups - lookups)
                served.setdefault(name, []).append(share)
            print(f"steady round {r}: {name}: {m}", file=sys.stderr)
    _use_cache(blocks.BlockCache(default_bytes))
    med = {
        n: {key: statistics.median(m[key] for m in ms) for key in ms[0]} for n, ms in got.items()
    }
    local = med["local"]["steady"]
    lines = [
        f"steady state: {fmt}, the default pipeline from a fresh iterator per contender "
        f"(shuffle(seed).repeat().to_iter_dataset().batch(512)): its first {args.first} batches timed "
        f"apart, then {args.steady_s:.0f} s of batches; {args.steady_rounds} rounds, contenders "
        "alternated, medians; each remote contender from an empty cache. The default cache "
        f"({default_bytes >> 20:,} MiB, {default_bytes / size:.1f}x the {fmt} data) holds it: "
        "a miss fetches the whole object; '128 MiB cache' holds "
        f"{(128 << 20) / size:.0%} of it: a miss fetches a {blocks.block_bytes() >> 10} KiB "
        "block; 'no cache': a 0-byte block cache (what CHUTE_REMOTE_CACHE_BYTES=0 gives: "
        "each record one exact range request). CPU: microseconds per record over the "
        "steady part, of this process (the client) and of the servers' process.",
        f"{'contender':<24} {'first rec/s':>12} {'steady rec/s':>13} {'vs local':>9} "
        f"{'cache served':>13} {'client us':>10} {'server us':>10}",
    ]
    for name, m in med.items():
        share = f"{statistics.median(served[name]):.0%}" if name in served else "-"
        lines.append(
            f"{name:<24} {m['first']:>12,.0f} {m['steady']:>13,.0f} {m['steady'] / local:>9.3f} "
            f"{share:>13} {m['client_us']:>10,.0f} {m['server_us']:>10,.0f}"
        )
    ratio = med[remote]["steady"] / local
    lines.append(
        f"{fmt}: issue 14's goal (remote at {args.latency_ms:.0f} ms >= 0.5x local, default "
        f"settings, steady state): {ratio:.2f}x: {'met' if ratio >= 0.5 else 'NOT met'}"
    )
    return lines


if __name__ == "__main__":
    main()
