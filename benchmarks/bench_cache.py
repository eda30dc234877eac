"""Disk cache: the second epoch of an expensive pipeline, read from the cache's record file.

Pipeline (seed 004's shape): the shared corpus's JSON records -> `json.loads` -> tokenize
with the shared BERT tokenizer -> an expensive per-element step (`--work-us` of numpy
work standing in for augmentation or feature extraction) -> `.cache(dir)` -> `.repeat(2)`.
Epoch 1 computes and writes the cache; epoch 2 reads it. Grain 0.2.18 has no disk cache:
its in-memory `CacheIterDataset` over the same pipeline is shown beside.

    python benchmarks/bench_cache.py [--n 4000] [--work-us 300]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import chute
from _harness import machine, shared_data, table


class Tokenize:
    def __init__(self) -> None:
        from tokenizers import Tokenizer

        path = shared_data() / "bert-base-uncased.tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(path))

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        ids = np.asarray(self.tokenizer.encode(record["description"]).ids, dtype=np.int32)
        return {"ids": ids[:128], "label": record["label"]}


class Expensive:
    """About `work_us` microseconds of numpy work per element."""

    def __init__(self, work_us: float) -> None:
        self.rounds = max(1, int(work_us / 15))

    def __call__(self, x: dict[str, Any]) -> dict[str, Any]:
        v = x["ids"].astype(np.float32)
        for _ in range(self.rounds):
            v = np.tanh(v * 0.5 + 0.1)
        return {**x, "features": v}


def epochs(ds: Any, n: int) -> tuple[float, float]:
    it = iter(ds)
    t0 = time.perf_counter()
    for _ in range(n):
        next(it)
    t1 = time.perf_counter()
    for _ in range(n):
        next(it)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=4000)
    parser.add_argument("--work-us", type=float, default=300)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import grain

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        subprocess.run(
            [sys.executable, str(shared_data() / "make_corpus.py"), str(corpus), str(args.n)],
            check=True,
        )
        records = corpus.read_bytes().splitlines()
        tokenize, expensive = Tokenize(), Expensive(args.work_us)

        def build(lib: Any) -> Any:
            ds = lib.MapDataset.source(records).map(json.loads).map(tokenize).map(expensive)
            return ds.to_iter_dataset(lib.ReadOptions(num_threads=0))

        chute_ds = build(chute).cache(Path(tmp) / "cache").repeat(2)
        c1, c2 = epochs(chute_ds, args.n)
        size = sum(f.stat().st_size for f in (Path(tmp) / "cache").rglob("*.crec"))
        grain_ds = grain.experimental.RepeatIterDataset(
            grain.experimental.CacheIterDataset(build(grain)), num_epochs=2
        )
        g1, g2 = epochs(grain_ds, args.n)
    n = args.n
    print(machine())
    print(f"{n} records, ~{args.work_us:.0f} us of work per element; cache {size / 1e6:.1f} MB")
    rows = [
        ["chute .cache(dir) (disk)", f"{n / c1:,.0f}", f"{n / c2:,.0f}", f"{c1 / c2:.1f}x"],
        ["grain CacheIterDataset (memory)", f"{n / g1:,.0f}", f"{n / g2:,.0f}", f"{g1 / g2:.1f}x"],
    ]
    print(table(["cache", "epoch 1 el/s", "epoch 2 el/s", "epoch 2 speedup"], rows))


if __name__ == "__main__":
    main()
