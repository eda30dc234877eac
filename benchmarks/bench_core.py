"""Framework overhead of the core engine, chute beside Grain and a hand-written loop.

Workload (issue 2): `MapDataset.range(200_000).shuffle(seed=1).map(double).batch(32)`
iterated through `to_iter_dataset(ReadOptions(num_threads=0))`, and the same through the
DataLoader API (`IndexSampler(shuffle=True)`, a Map transform, `Batch(32)`,
`worker_count=0`). The hand-written loop does the same work in plain Python/numpy (a numpy
permutation, the map called per element, `np.asarray` per batch): the practical limit.

    python benchmarks/bench_core.py [--n 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import chute
from _harness import count_elements, machine, rate, rates, table


def double(x: int) -> int:
    return x * 2


class Double(chute.MapTransform):
    def map(self, element: int) -> int:
        return element * 2


def hand_loop(n: int) -> int:
    perm = np.random.default_rng(1).permutation(n)
    count = 0
    for i in range(0, n, 32):
        batch = np.asarray([double(x) for x in perm[i : i + 32].tolist()])
        count += len(batch)
    return count


def chute_dataset(n: int) -> int:
    ds = chute.MapDataset.range(n).shuffle(seed=1).map(double).batch(32)
    return count_elements(ds.to_iter_dataset(chute.ReadOptions(num_threads=0)))


def chute_loader(n: int) -> int:
    loader = chute.DataLoader(
        data_source=chute.sources.RangeDataSource(0, n, 1),
        sampler=chute.IndexSampler(n, shuffle=True, seed=1, num_epochs=1),
        operations=[Double(), chute.Batch(32)],
        worker_count=0,
        read_options=chute.ReadOptions(num_threads=0),
    )
    return count_elements(loader)


def grain_dataset(n: int) -> int:
    import grain

    ds = grain.MapDataset.range(n).shuffle(seed=1).map(double).batch(32)
    return count_elements(ds.to_iter_dataset(grain.ReadOptions(num_threads=0)))


def grain_loader(n: int) -> int:
    import grain

    class GDouble(grain.transforms.Map):
        def map(self, element: int) -> int:
            return element * 2

    loader = grain.DataLoader(
        data_source=grain.sources.RangeDataSource(0, n, 1),
        sampler=grain.samplers.IndexSampler(n, shuffle=True, seed=1, num_epochs=1),
        operations=[GDouble(), grain.transforms.Batch(32)],
        worker_count=0,
        read_options=grain.ReadOptions(num_threads=0),
    )
    return count_elements(loader)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    n = args.n
    warnings.filterwarnings("ignore")
    print(f"# bench_core: {n:,} elements, batch 32, best of {args.repeats}\n# {machine()}")
    r = rates(
        {
            "hand": lambda: hand_loop(n),
            "chute_ds": lambda: chute_dataset(n),
            "grain_ds": lambda: grain_dataset(n),
            "chute_dl": lambda: chute_loader(n),
        },
        args.repeats,
    )
    grain_dl = rate(lambda: grain_loader(n), 1)  # ~10 s a run: once is enough for a 100x bar
    hand = r["hand"]
    results = {
        "Dataset API": (r["chute_ds"], r["grain_ds"]),
        "DataLoader API": (r["chute_dl"], grain_dl),
    }
    rows = []
    for name, (c, g) in results.items():
        rows.append(
            [
                name,
                f"{c:,.0f}",
                f"{g:,.0f}",
                f"{c / g:,.1f}x",
                f"{c / hand:.2f}",
                f"{1e9 / c - 1e9 / hand:,.0f}",
            ]
        )
    rows.append(["hand-written loop", f"{hand:,.0f}", "", "", "1.00", "0"])
    print(
        table(
            [
                "workload",
                "chute elem/s",
                "grain elem/s",
                "chute/grain",
                "chute/hand",
                "chute overhead ns/elem",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
