"""`chute.experimental.skip`: how long skipping 10^6 steps takes, after a loss spike.

Pipelines (batches of 8):

- `shuffled, repeated`: `MapDataset.range(10**6).seed(0).shuffle().repeat(100).map(f)
  .batch(8).to_iter_dataset()`: its position is index arithmetic, so the skip is O(1);
- `mix of three`: `MapDataset.mix` of three shuffled ranges, weights 0.5/0.3/0.2,
  repeated: index arithmetic too;
- `filtered`: `to_iter_dataset().filter(f).batch(8)` over the shuffled range: the filter
  must read to know where step n begins, so the skip reads every element before it (the
  row gives the cost per step skipped, to compare with consuming the steps).

Each row is the median of `--rounds` runs in this process, each on a fresh iterator that
has handed out one batch. The skipped iterator's next batch is checked against the same
step read from a fresh iterator with `set_next_index` (index rows) or against consuming
(the filtered row, on a smaller n).

    python benchmarks/bench_skip.py [--rounds 5] [--filtered-steps 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import chute
from chute.experimental import skip

N = 10**6


def plus_one(x: int) -> int:
    return x + 1


def odd(x: int) -> bool:
    return x % 2 == 1


def shuffled() -> chute.IterDataset[Any]:
    return (
        chute.MapDataset.range(N).seed(0).shuffle().repeat(100).map(plus_one).batch(8)
    ).to_iter_dataset()


def mixed() -> chute.IterDataset[Any]:
    parts = [chute.MapDataset.range(k * N, (k + 1) * N).seed(k).shuffle() for k in range(3)]
    mix = chute.MapDataset.mix(parts, [0.5, 0.3, 0.2]).repeat(100).map(plus_one)
    return mix.batch(8).to_iter_dataset()


def filtered() -> chute.IterDataset[Any]:
    return (
        chute.MapDataset.range(N)
        .seed(0)
        .shuffle()
        .repeat(100)
        .to_iter_dataset()
        .filter(odd)
        .batch(8)
    )


def timed_skip(build: Any, n: int) -> tuple[float, Any]:
    it = iter(build())
    next(it)
    start = time.perf_counter()
    skip(it, n)
    took = time.perf_counter() - start
    out = next(it)
    it.close()
    return took, out


def consumed(build: Any, n: int) -> tuple[float, Any]:
    it = iter(build())
    next(it)
    start = time.perf_counter()
    for _ in range(n):
        next(it)
    took = time.perf_counter() - start
    out = next(it)
    it.close()
    return took, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--filtered-steps", type=int, default=20_000)
    args = parser.parse_args()
    print(f"{'pipeline':<22} {'steps':>9} {'skip, s':>10} {'consume, s':>11} {'per step':>10}")
    for name, build in (("shuffled, repeated", shuffled), ("mix of three", mixed)):
        times = []
        for _ in range(args.rounds):
            took, out = timed_skip(build, N)
            times.append(took)
        check = iter(build())
        chute.experimental.set_next_index(check, N + 1)
        assert np.array_equal(out, next(check)), name
        median = statistics.median(times)
        print(f"{name:<22} {N:>9,} {median:>10.4f} {'-':>11} {median / N * 1e9:>8.1f}ns")
    n = args.filtered_steps
    skips, consumes = [], []
    for _ in range(args.rounds):
        took, out = timed_skip(filtered, n)
        took_c, out_c = consumed(filtered, n)
        assert np.array_equal(out, out_c)
        skips.append(took)
        consumes.append(took_c)
    s, c = statistics.median(skips), statistics.median(consumes)
    print(f"{'filtered':<22} {n:>9,} {s:>10.4f} {c:>11.4f} {s / n * 1e6:>8.1f}us")


if __name__ == "__main__":
    main()
