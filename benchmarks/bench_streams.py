"""Streamed JSONL shards: worker processes (seed 002) and interleave parallelism vs tf.data.

(a) Seed 002's parallel JSONL pipeline: the shared corpus split into `--shards` JSONL
    files, `JsonlIterDataset(files, cycle_length=...)` -> parse JSON -> tokenize the
    description with the real bert-base-uncased tokenizer (`tokenizers`) -> batch 32
    (padded), with 0 and 2 worker processes. The workers read whole files (parse and
    tokenize there); the main process merges them by the interleave rule and batches. The
    output is the same for both (checked). Rates count from the first batch (worker start
    is reported apart); the CPU seconds of the main process and of the workers show
    whether the workers got the CPU time a speed-up needs (on a machine shared with
    other jobs they may not).
(b) Streaming 64 JSONL shards with interleave (cycle_length 16) and tf.data's
    `interleave(num_parallel_calls=AUTOTUNE)` over the same files, side by side: chute with
    `parallelism` 0 (on the consumer's thread), 1, the default (one thread per open file)
    and 32, and tf.data. With `--latency-ms` each file open and each 64 KiB block read
    sleeps that long (as a request to object storage would take; the sleep releases the
    GIL like a network read), in both libraries through the same Python reader (in
    tf.data through `from_generator`, which adds its own per-element cost). tf.data's
    lines cross into Python in batches of 1024; chute's one by one.

Contenders alternate within each round; the table shows the median of `--rounds` rounds.
`--url-prefix` points (b) at another filesystem once chute reads fsspec URLs (the files
are then expected at PREFIX/shard-NN.jsonl, written by a previous local run and copied).

    python benchmarks/bench_streams.py [--records 40000] [--rounds 3] [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np

import chute
from _corpus import Tokenize, corpus_jsonl
from _harness import machine, table

_BLOCK = 64 << 10


def split_corpus(n: int, shards: int, out: Path) -> list[str]:
    """The first `n` corpus lines dealt into `shards` files, line i to file i % shards."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"shard-{k:02d}.jsonl" for k in range(shards)]
    if not all(p.exists() for p in paths):
        lines = corpus_jsonl(max(n, 1000)).read_bytes().splitlines(keepends=True)[:n]
        for k, p in enumerate(paths):
            p.write_bytes(b"".join(lines[k::shards]))
    return [str(p) for p in paths]


class Parse:
    """JSON text to a dict (seed 002's parse step, picklable)."""

    def __call__(self, line: bytes) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(line)
        return out


def seed_002(paths: list[str], workers: int, cycle: int) -> chute.IterDataset[Any]:
    ds = chute.experimental.JsonlIterDataset(paths, cycle_length=cycle).map(Tokenize())
    ds = ds.batch(32, pad_value=0)
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))


def _descendants_cpu() -> float:
    """CPU seconds of this process's descendants alive now (worker processes)."""
    import psutil

    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def timed(make: Callable[[], Any]) -> tuple[float, float, int, list[Any], float, float]:
    """(seconds to the first element, elements/s after it, elements, a digest, CPU
    seconds of this process, CPU seconds of worker processes)."""
    cpu0, kids0 = time.process_time(), _descendants_cpu()
    t0 = time.perf_counter()
    it = iter(make())
    first = next(it)
    t1 = time.perf_counter()
    n, digest = _size(first), [_digest(first)]
    for x in it:
        n += _size(x)
        digest.append(_digest(x))
    t2 = time.perf_counter()
    cpu, kids = time.process_time() - cpu0, _descendants_cpu() - kids0
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return t1 - t0, (n - _size(first)) / (t2 - t1), n, digest, cpu, kids


def _size(x: Any) -> int:
    if isinstance(x, dict):
        return len(next(iter(x.values())))
    return 1


def _digest(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: np.asarray(v).tobytes() for k, v in x.items()}
    return x


# -- (b): 64 shards, with a reader that can add per-request latency ---------------------


class SlowLines:
    """The lines of one file, read in 64 KiB blocks; the open and every block read sleep
    `latency` seconds. The same reader serves chute and tf.data."""

    def __init__(self, path: str, latency: float) -> None:
        self.path, self.latency = path, latency

    def __call__(self) -> Iterator[bytes]:
        if self.latency:
            time.sleep(self.latency)
        with open(self.path, "rb") as f:
            rest = b""
            while True:
                if self.latency:
                    time.sleep(self.latency)
                block = f.read(_BLOCK)
                if not block:
                    break
                lines = (rest + block).split(b"\n")
                rest = lines.pop()
                yield from lines
            if rest:
                yield rest


def chute_lines(paths: list[str], latency: float, parallelism: int | None) -> Any:
    if latency:
        shards = [chute.IterDataset.source(SlowLines(p, latency)) for p in paths]
        return chute.experimental.InterleaveIterDataset(
            shards, cycle_length=16, iter_buffer_size=64, parallelism=parallelism
        )
    return chute.experimental.FileLinesIterDataset(
        paths, parse=bytes, cycle_length=16, parallelism=parallelism
    )


def tf_lines(paths: list[str], latency: float) -> Any:
    import tensorflow as tf

    files = tf.data.Dataset.from_tensor_slices(paths)
    if latency:

        def open_file(path: Any) -> Any:
            return tf.data.Dataset.from_generator(
                lambda p: SlowLines(p.decode(), latency)(),
                args=(path,),
                output_signature=tf.TensorSpec((), tf.string),
            )

    else:
        open_file = tf.data.TextLineDataset
    ds = files.interleave(open_file, cycle_length=16, num_parallel_calls=tf.data.AUTOTUNE)
    # Lines cross into Python 1024 at a time: one by one, tf.data's per-element cost in
    # Python (~150 us) would hide what the interleave does.
    return ds.batch(1024).prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=40000)
    parser.add_argument("--shards", type=int, default=16, help="files for (a)")
    parser.add_argument("--cycle", type=int, default=16, help="cycle_length for (a)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--url-prefix", default=None, help="where (b)'s 64 shards are")
    parser.add_argument("--skip", choices=["a", "b"], default=None)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    root = Path(tempfile.gettempdir()) / "chute-bench-streams"
    print(machine())
    print(f"load average at start: {os.getloadavg()[0]:.1f}")

    if args.skip != "a":
        paths = split_corpus(args.records, args.shards, root / f"a-{args.shards}-{args.records}")
        print(
            f"\n(a) seed 002: {args.records:,} corpus lines in {args.shards} JSONL shards, "
            f"cycle_length={args.cycle}; parse, tokenize (bert-base-uncased), batch 32 padded"
        )
        results: dict[int, list[tuple[float, float]]] = {0: [], 2: []}
        cpus: dict[int, list[tuple[float, float]]] = {0: [], 2: []}
        digests: dict[int, list[Any]] = {}
        timed(lambda: seed_002(paths[:2], 2, args.cycle))  # warm-up: forkserver, tokenizer
        for _ in range(args.rounds):
            for workers in (0, 2):
                start, r, n, digest, cpu, kids = timed(
                    lambda w=workers: seed_002(paths, w, args.cycle)
                )
                results[workers].append((start, r))
                cpus[workers].append((cpu, kids))
                digests[workers] = digest
        same = "yes" if _same(digests[0], digests[2]) else "NO"
        base = statistics.median(r for _, r in results[0])
        paired = [r2 / r0 for (_, r0), (_, r2) in zip(results[0], results[2])]
        rows = []
        for workers, runs in results.items():
            med = statistics.median(r for _, r in runs)
            rows.append(
                [
                    str(workers),
                    f"{med:,.0f}",
                    f"{med / base:.2f}x",
                    f"{statistics.median(s for s, _ in runs):.2f}",
                    f"{statistics.median(c for c, _ in cpus[workers]):.2f}",
                    f"{statistics.median(k for _, k in cpus[workers]):.2f}",
                    ", ".join(f"{r:,.0f}" for _, r in runs),
                ]
            )
        print(
            table(
                [
                    "workers",
                    "elements/s",
                    "vs 0",
                    "first batch s",
                    "CPU s main",
                    "CPU s workers",
                    "each round",
                ],
                rows,
            )
        )
        print(
            "2 workers / 0 workers, round by round (the two ran back to back): "
            + ", ".join(f"{x:.2f}x" for x in paired)
            + f"; median {statistics.median(paired):.2f}x (goal >= 1.6x)"
        )
        print(f"same batches with 0 and 2 workers: {same}")

    if args.skip != "b":
        if args.url_prefix:
            paths = [f"{args.url_prefix.rstrip('/')}/shard-{k:02d}.jsonl" for k in range(64)]
        else:
            paths = split_corpus(args.records, 64, root / f"b-64-{args.records}")
        for latency_ms in (0.0, args.latency_ms):
            latency = latency_ms / 1000
            print(
                f"\n(b) 64 JSONL shards ({args.records:,} lines), interleave cycle_length=16, "
                + (
                    f"{latency_ms:g} ms per file open and per 64 KiB read"
                    if latency
                    else "local files, no added latency"
                )
            )
            contenders: dict[str, Callable[[], Any]] = {
                "chute parallelism=0 (consumer thread)": partial(chute_lines, paths, latency, 0),
                "chute parallelism=1": partial(chute_lines, paths, latency, 1),
                "chute parallelism default (17)": partial(chute_lines, paths, latency, None),
                "chute parallelism=32": partial(chute_lines, paths, latency, 32),
                "tf.data interleave(AUTOTUNE), batch(1024)": partial(tf_lines, paths, latency),
            }
            rates: dict[str, list[float]] = {k: [] for k in contenders}
            counts: dict[str, int] = {}
            for make in contenders.values():  # warm-up, untimed: imports, graph building
                _count(make())
            for _ in range(args.rounds):
                for name, make in contenders.items():
                    t0 = time.perf_counter()
                    n = _count(make())
                    rates[name].append(n / (time.perf_counter() - t0))
                    counts[name] = n
            base = statistics.median(rates["tf.data interleave(AUTOTUNE), batch(1024)"])
            rows = [
                [
                    name,
                    f"{statistics.median(rs):,.0f}",
                    f"{statistics.median(rs) / base:.2f}x",
                    str(counts[name]),
                ]
                for name, rs in rates.items()
            ]
            print(table(["reader", "lines/s (median)", "vs tf.data", "lines"], rows))
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


def _count(stream: Any) -> int:
    """Lines in `stream`: elements, or rows of the batches tf.data hands over."""
    return sum(len(x) if isinstance(x, np.ndarray) else 1 for x in stream)


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b))


if __name__ == "__main__":
    main()
