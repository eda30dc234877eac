"""`chute.experimental.provenance`: how long naming the records of a step takes.

The pipelines of `bench_skip.py` (batches of 8): `shuffled, repeated` and `mix of three`
are index arithmetic, so the records of step 10^6 are computed from positions and seeds
(no element is read, no map runs); `filtered` (`to_iter_dataset().filter(f).batch(8)`)
runs the filter's predicate on the elements below it up to the step, so its row gives
the cost per step before the one asked for. Each row is the median of `--rounds` calls,
checked against the step read from the pipeline.

    python benchmarks/bench_provenance.py [--rounds 5] [--filtered-step 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from bench_skip import N, filtered, mixed, shuffled
from chute.experimental import provenance, skip


def timed(build: Any, step: int) -> tuple[float, list[dict[str, Any]]]:
    ds = build()
    start = time.perf_counter()
    (records,) = provenance(iter(ds), [step])
    return time.perf_counter() - start, records


def step_of(build: Any, step: int) -> Any:
    it = iter(build())
    skip(it, step)
    out = next(it)
    it.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--filtered-step", type=int, default=20_000)
    args = parser.parse_args()
    print(f"{'pipeline':<22} {'step':>9} {'provenance, s':>14} {'per step before':>16}")
    rows: list[tuple[str, Any, int]] = [
        ("shuffled, repeated", shuffled, N),
        ("mix of three", mixed, N),
        ("filtered", filtered, args.filtered_step),
    ]
    for name, build, step in rows:
        times = []
        for _ in range(args.rounds):
            took, records = timed(build, step)
            times.append(took)
        # The elements are the record indices plus one (the mix: its parts' ranges).
        values = np.asarray(step_of(build, step))
        if name == "mix of three":
            named = [N * r["source"] + r["index"] + 1 for r in records]
        elif name == "filtered":
            named = [r["index"] for r in records]
        else:
            named = [r["index"] + 1 for r in records]
        assert named == values.tolist(), name
        median = statistics.median(times)
        per = f"{median / step * 1e6:.2f}us" if name == "filtered" else "-"
        print(f"{name:<22} {step:>9,} {median:>14.4f} {per:>16}")


if __name__ == "__main__":
    main()
