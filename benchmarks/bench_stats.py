"""What debug mode (per-stage statistics) costs, per element and per stage.

The same pipelines iterated with `py_debug_mode` off and on, interleaved in one run:
- map-side: range -> shuffle -> map -> map -> to_iter_dataset (block-timed MapDataset
  stages), and
- iter-side: range -> to_iter_dataset -> map -> filter -> map_with_index (an element-timed
  proxy around every IterDataset stage).
Overhead per element per stage = (1/rate_on - 1/rate_off) / number of stages. Off costs
nothing by construction (the choice is made once, in `__iter__`); the "off" row is the
reference.

    python benchmarks/bench_stats.py [--n 200000]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import chute
from _harness import machine, rates, table


def inc(x: int) -> int:
    return x + 1


def keep(x: int) -> bool:
    return x % 7 != 0


def pair(i: int, x: int) -> int:
    return x + i


def map_side(n: int) -> chute.IterDataset[int]:
    ds = chute.MapDataset.range(n).shuffle(seed=1).map(inc).map(inc)
    return ds.to_iter_dataset(chute.ReadOptions(num_threads=0))


def iter_side(n: int) -> chute.IterDataset[int]:
    ds = chute.MapDataset.range(n).to_iter_dataset(chute.ReadOptions(num_threads=0))
    return ds.map(inc).filter(keep).map_with_index(pair)


def run(build: object, n: int, debug: bool) -> int:
    chute.config.update("py_debug_mode", debug)
    try:
        it = iter(build(n))  # type: ignore[operator]
        count = sum(1 for _ in it)
    finally:
        chute.config.update("py_debug_mode", False)
    return count


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    chute.config.update("py_debug_summary_interval_s", 3600.0)
    n = args.n
    print(f"# bench_stats: {n:,} elements, best of {args.repeats}\n# {machine()}")
    rows = []
    for name, build, stages in (("map-side", map_side, 5), ("iter-side", iter_side, 5)):
        r = rates(
            {
                "off": lambda b=build: run(b, n, False),
                "on": lambda b=build: run(b, n, True),
            },
            args.repeats,
        )
        per = (1e9 / r["on"] - 1e9 / r["off"]) / stages
        rows.append([name, str(stages), f"{r['off']:,.0f}", f"{r['on']:,.0f}", f"{per:,.0f}"])
    print(table(["pipeline", "stages", "off elem/s", "on elem/s", "on: ns/elem/stage"], rows))


if __name__ == "__main__":
    import contextlib

    with contextlib.redirect_stderr(open(os.devnull, "w")):
        main()
