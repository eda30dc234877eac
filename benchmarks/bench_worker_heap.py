"""Why chute's worker processes tune glibc's allocator (`exec/mp/heap.py`), measured.

A stage that makes a fresh array per element frees blocks of hundreds of KiB to MiBs,
element after element. With glibc's defaults such blocks are `mmap`ed and handed back on
free, so every element faults its pages in again; `keep_freed_memory` (which only chute's
workers apply, never the user's process) keeps them for reuse.

Each contender runs in a fresh Python process: `--elements` elements, each a float32 array
of a size drawn from 256 KiB to 8 MiB filled by `np.full` and reduced (a decode's shape of
work), then freed. It prints minor page faults and seconds per element, default allocator
against `keep_freed_memory`, alternating, medians over `--rounds`.

    python benchmarks/bench_worker_heap.py [--elements 400] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import numpy as np
tuned, n = sys.argv[1] == "tuned", int(sys.argv[2])
if tuned:
    from chute._src.exec.mp import heap
    heap.keep_freed_memory()
sizes = np.random.default_rng(0).integers(64 << 10, 2 << 20, n)  # float32 elements
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
start = time.perf_counter()
total = 0.0
for k in sizes:
    a = np.full(int(k), 1.5, dtype=np.float32)
    total += float(a[:: 4096].sum())
    del a
took = time.perf_counter() - start
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"faults": faults / n, "us": took / n * 1e6}))
"""


def run(kind: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(n)], capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"default": [], "tuned": []}
    for _ in range(args.rounds):
        for kind in runs:
            runs[kind].append(run(kind, args.elements))
    print(f"{'allocator':<28} {'page faults/elem':>17} {'us/elem':>9}")
    for kind, label in (("default", "glibc default"), ("tuned", "keep_freed_memory (workers)")):
        faults = statistics.median(r["faults"] for r in runs[kind])
        us = statistics.median(r["us"] for r in runs[kind])
        print(f"{label:<28} {faults:>17,.0f} {us:>9,.0f}")


if __name__ == "__main__":
    main()
