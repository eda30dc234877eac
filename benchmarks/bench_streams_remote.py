"""Streaming 64 JSONL shards from a bucket with interleave, against local disk and tf.data.

The shared corpus's first `--records` lines dealt into 64 JSONL files (line i to file
i % 64), and again with `--large-records` lines (longer shards: the steady state, where
the per-shard costs of opening weigh less), read with interleave (cycle_length 16) from:
- local disk;
- moto's S3 server behind a proxy adding `--latency-ms` per request (moto closes the
  connection after each answer and runs a thread per request: a slow server);
- a minimal keep-alive range server (tests/remote_helpers.py RangeServer) with the same
  added latency: what the client does when the server is not the limit.
The servers run in a process of their own. Contenders, each reading every line once:
- chute `FileLinesIterDataset(urls, parse=bytes, cycle_length=16)` with default settings
  (lines as bytes, like tf.data's), and `JsonlIterDataset` (lines parsed as JSON);
- tf.data `interleave(num_parallel_calls=AUTOTUNE)` over the same files: `TextLineDataset`
  locally; from the bucket through fsspec (s3fs, the same storage options) in
  `from_generator`, since `tf.io.gfile` has no S3 without tensorflow-io. Its lines cross
  into Python 1024 at a time (`batch(1024)`); from the bucket it reads the first
  `--tf-remote-lines` lines (a rate: its whole run would take minutes). Each tf.data
  read runs in a fresh process of its own, so TensorFlow's runtime threads never share
  a process with the chute reads being timed.
Contenders alternate within each round; medians of `--rounds` rounds. Every chute read
from a bucket starts cold, as in a fresh process: the block cache emptied and no
client (connection pool) kept from an earlier round.

    python benchmarks/bench_streams_remote.py [--records 100000] [--large-records 400000]
        [--rounds 3] [--tf-rounds R] [--tf-remote-lines 20000] [--latency-ms 20]
        [--readers "chute lines,tf.data lines"] [--places local,fast]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import chute
from _harness import dummy_s3_credentials, emit, machine, object_servers, table
from bench_streams import split_corpus

SHARDS = 64
CYCLE = 16
READERS = ("chute lines", "chute JSONL (parsed)", "tf.data lines")


def _endpoint(port: int) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}


def chute_lines(urls: list[str], options: dict[str, Any] | None, parse: bool) -> Iterator[Any]:
    if parse:
        ds: Any = chute.experimental.JsonlIterDataset(
            urls, cycle_length=CYCLE, storage_options=options
        )
    else:
        ds = chute.experimental.FileLinesIterDataset(
            urls, parse=bytes, cycle_length=CYCLE, storage_options=options
        )
    return iter(ds)


class FsspecLines:
    """The lines of one object read through fsspec (for tf.data's `from_generator`)."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def __call__(self, url: bytes) -> Iterator[bytes]:
        import fsspec

        with fsspec.open(url.decode(), "rb", **self.options) as f:
            for line in f:
                line = line.rstrip(b"\n")
                if line:
                    yield line


def tf_lines(urls: list[str], options: dict[str, Any] | None, limit: int = 0) -> Iterator[Any]:
    """tf.data's lines of `urls` (the first `limit`, when given: the pipeline then ends
    by itself, so no reader of it goes on in the background after it is timed)."""
    import tensorflow as tf

    files = tf.data.Dataset.from_tensor_slices(urls)
    if options is None:
        open_file: Callable[[Any], Any] = tf.data.TextLineDataset
    else:
        reader = FsspecLines(options)

        def open_file(url: Any) -> Any:
            return tf.data.Dataset.from_generator(
                reader, args=(url,), output_signature=tf.TensorSpec((), tf.string)
            )

    ds = files.interleave(open_file, cycle_length=CYCLE, num_parallel_calls=tf.data.AUTOTUNE)
    if limit:
        ds = ds.take(limit)
    return ds.batch(1024).prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def tf_in_child(urls: list[str], options: dict[str, Any] | None, limit: int, want: int) -> float:
    """tf.data's rate over `urls`, measured in a fresh process of its own (warmed up on one
    file untimed): TensorFlow's runtime threads then never run in the process that times
    chute, nor chute's in TensorFlow's."""
    job = json.dumps({"urls": urls, "options": options, "limit": limit, "want": want})
    cmd = [sys.executable, os.path.abspath(__file__), "--tf-child", job]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"tf.data's process failed:\n{done.stderr[-3000:]}")
    return float(done.stdout.strip().splitlines()[-1])


def tf_child(job: dict[str, Any]) -> None:
    dummy_s3_credentials()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    urls, options, limit = job["urls"], job["options"], job["limit"]
    count(tf_lines(urls[:1], options), True)  # TensorFlow's start and first use, untimed
    gc.collect()
    t0 = time.perf_counter()
    n = count(tf_lines(urls, options, limit), True)
    rate = n / (time.perf_counter() - t0)
    if n != job["want"]:
        raise AssertionError(f"tf.data read {n} lines, not {job['want']}")
    print(rate)


def count(it: Iterator[Any], batched: bool) -> int:
    n = 0
    for x in it:
        n += len(x) if batched else 1
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return n


def cold_remote_caches() -> None:
    """Forgets what an earlier read left in this process (cached blocks, objects found and
    not opened, the clients and their pooled connections), so each timed read from a
    bucket costs what it costs a fresh process."""
    from chute._src.storage.remote import blocks, file, stores

    blocks.cache().clear()
    with file._found_lock:
        file._found.clear()
    stores._stores.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=100000)
    ap.add_argument("--large-records", type=int, default=400000, help="0: no large run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument(
        "--tf-rounds",
        type=int,
        default=None,
        help="rounds tf.data runs in (its remote reads are slow)",
    )
    ap.add_argument(
        "--tf-remote-lines",
        type=int,
        default=20000,
        help="lines tf.data reads from a bucket (its rate; 0: all)",
    )
    ap.add_argument(
        "--readers",
        default=",".join(READERS),
        help=f"comma-separated contenders to run, of: {', '.join(READERS)}",
    )
    ap.add_argument(
        "--places",
        default="local,moto,fast",
        help="comma-separated places to read from, of: local, moto, fast",
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tf-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tf_child:
        tf_child(json.loads(args.tf_child))
        return
    for name, chosen, known in (
        ("--readers", args.readers, READERS),
        ("--places", args.places, ("local", "moto", "fast")),
    ):
        bad = set(chosen.split(",")) - set(known)
        if bad:
            ap.error(f"{name}: unknown {sorted(bad)}; choose among {', '.join(known)}")
    dummy_s3_credentials()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sizes = [n for n in (args.records, args.large_records) if n]
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "served"
        runs = {n: split_corpus(n, SHARDS, root / "bench" / f"jsonl-{n}") for n in sizes}
        with object_servers(root, [args.latency_ms]) as (moto, moto_slow, range_slow):
            tables = [run(args, n, paths, moto, moto_slow, range_slow) for n, paths in runs.items()]
    ms = f"+{args.latency_ms:.0f}ms"
    lines = [
        f"bench_streams_remote: the corpus's first N lines in {SHARDS} JSONL shards (line i "
        f"to shard i % {SHARDS}), interleave cycle_length={CYCLE}, default settings; the "
        "whole stream read (time includes building the dataset, which finds every object, "
        "and opening; each reader warmed up once on one shard untimed; every chute read "
        "from a bucket starts with an empty block cache and a new client); "
        f"{args.rounds} rounds (tf.data: {args.tf_rounds or args.rounds}), contenders "
        "alternated, medians",
        f"'moto {ms}': moto's S3 server behind a proxy adding {ms} per request (it closes the "
        "connection after every answer); "
        f"'fast {ms}': a keep-alive range server with {ms} per request; servers in a process "
        "of their own",
        "tf.data: TextLineDataset locally, fsspec (s3fs) in from_generator from the bucket "
        + (
            f"(its first {args.tf_remote_lines:,} lines: a rate); "
            if args.tf_remote_lines
            else "; "
        )
        + "interleave(num_parallel_calls=AUTOTUNE), batch(1024)",
        f"machine: {machine()}; load average {load0:.1f} at start, "
        f"{os.getloadavg()[0]:.1f} at end (a shared machine)",
    ]
    for t in tables:
        lines += ["", *t]
    emit(lines, args.out)


def run(
    args: argparse.Namespace,
    records: int,
    paths: list[str],
    moto: int,
    moto_slow: int,
    range_slow: int,
) -> list[str]:
    import s3fs

    fs = s3fs.S3FileSystem(**_endpoint(moto))
    if not fs.exists("bench"):
        fs.mkdir("bench")
    key = f"bench/{Path(paths[0]).parent.name}"
    for p in paths:
        fs.put_file(p, f"{key}/{Path(p).name}")
    urls = [f"s3://{key}/{Path(p).name}" for p in paths]
    ms = f"+{args.latency_ms:.0f}ms"
    places: dict[str, tuple[list[str], dict[str, Any] | None]] = {
        "local": (paths, None),
        f"moto {ms}": (urls, _endpoint(moto_slow)),
        f"fast {ms}": (urls, _endpoint(range_slow)),
    }
    wanted = args.places.split(",")
    places = {k: v for k, v in places.items() if k.split()[0] in wanted}
    tf_limit = args.tf_remote_lines
    readers: dict[str, Callable[[list[str], dict[str, Any] | None], tuple[Iterator[Any], bool]]]
    readers = {
        "chute lines": lambda u, o: (chute_lines(u, o, parse=False), False),
        "chute JSONL (parsed)": lambda u, o: (chute_lines(u, o, parse=True), False),
        "tf.data lines": lambda u, o: (tf_lines(u, o, tf_limit if o else 0), True),
    }
    readers = {k: v for k, v in readers.items() if k in args.readers.split(",")}
    for reader, make in readers.items():  # one-time costs (imports) untimed
        if reader.startswith("tf.data"):
            continue  # its own process warms itself up
        for where, options in places.values():
            it, batched = make(where[:1], options)
            count(it, batched)
            del it
    gc.collect()
    rates: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for reader, make in readers.items():
            if reader.startswith("tf.data") and r >= (args.tf_rounds or args.rounds):
                continue
            for place, (where, options) in places.items():
                tf_remote = reader.startswith("tf.data") and options is not None
                want = min(records, args.tf_remote_lines or records) if tf_remote else records
                if reader.startswith("tf.data"):
                    limit = tf_limit if options is not None else 0
                    rate = tf_in_child(where, options, limit, want)
                    rates.setdefault((reader, place), []).append(rate)
                    continue
                if options is not None:
                    cold_remote_caches()
                t0 = time.perf_counter()
                it, batched = make(where, options)
                n = count(it, batched)
                rate = n / (time.perf_counter() - t0)
                del it
                gc.collect()  # every pipeline torn down before the next one is timed
                if n != want:
                    raise AssertionError(f"{reader} at {place} read {n} lines, not {want}")
                rates.setdefault((reader, place), []).append(rate)
                print(
                    f"{records} lines, round {r}: {reader} {place}: {rate:,.0f} lines/s",
                    file=sys.stderr,
                )
    med = {k: statistics.median(v) for k, v in rates.items()}

    def ratio(key: tuple[str, str], unit: str = "") -> str:
        return f"{med[reader, place] / med[key]:.2f}{unit}" if key in med else "-"

    rows = []
    for reader in readers:
        for place in places:
            rows.append(
                [
                    reader,
                    place,
                    f"{med[reader, place]:,.0f}",
                    ratio((reader, "local")),
                    ratio(("tf.data lines", place), "x"),
                    " ".join(f"{x:,.0f}" for x in rates[reader, place]),
                ]
            )
    head = ["reader", "from", "lines/s", "vs local", "vs tf.data", "each round"]
    kib = sum(os.path.getsize(p) for p in paths) / SHARDS / 1024
    return [
        f"{records:,} lines ({kib:,.0f} KiB a shard):",
        table(head, rows),
    ]


if __name__ == "__main__":
    main()
