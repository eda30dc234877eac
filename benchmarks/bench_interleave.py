"""Interleave over 16 files with a simulated per-read latency: throughput vs cycle_length.

Each "file" is a source of `--records` records whose every read sleeps `--latency-ms`
(time to first byte of remote storage; the sleep releases the GIL as a network read
does). Inputs are read without their own threads (`ReadOptions(num_threads=0)`), so any
parallelism comes from the interleave. chute's `InterleaveIterDataset` reads each open
input ahead on its own thread; Grain 0.2.18's `InterleaveIterDataset` (same inputs, same
output order) is shown beside it.

    python benchmarks/bench_interleave.py [--files 16] [--records 100] [--latency-ms 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import chute
from _harness import machine, table


class SlowFile:
    """`n` records; each read takes `latency` seconds."""

    def __init__(self, index: int, n: int, latency: float) -> None:
        self.index, self.n, self.latency = index, n, latency

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.latency)
        return self.index * 1_000_000 + i


def run(lib: Any, files: int, records: int, latency: float, cycle: int) -> tuple[float, list[int]]:
    options = lib.ReadOptions(num_threads=0)
    inputs = [
        lib.MapDataset.source(SlowFile(i, records, latency)).to_iter_dataset(options)
        for i in range(files)
    ]
    ds = lib.experimental.InterleaveIterDataset(inputs, cycle_length=cycle)
    t0 = time.perf_counter()
    out = list(ds)
    return len(out) / (time.perf_counter() - t0), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import grain

    latency = args.latency_ms / 1000
    print(machine())
    print(
        f"{args.files} files x {args.records} records, {args.latency_ms} ms per read "
        f"(one reader would do {1 / latency:,.0f} records/s)"
    )
    rows = []
    for cycle in (1, 2, 4, 8, 16):
        c_rate, c_out = run(chute, args.files, args.records, latency, cycle)
        g_rate, g_out = run(grain, args.files, args.records, latency, cycle)
        same = "yes" if c_out == g_out else "NO"
        rows.append(
            [str(cycle), f"{c_rate:,.0f}", f"{c_rate * latency:.1f}x", f"{g_rate:,.0f}", same]
        )
    print(table(["cycle_length", "chute rec/s", "vs 1 reader", "grain rec/s", "same order"], rows))


if __name__ == "__main__":
    main()
