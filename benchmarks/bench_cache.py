"""Caches: the second epoch of an expensive pipeline, and the memory a cache holds.

Pipeline (seed 004's shape): the shared corpus's JSON records -> `json.loads` -> tokenize
with the shared BERT tokenizer -> an expensive per-element step (`--work-us` of numpy
work standing in for augmentation or feature extraction, which also grows the element:
float32 features beside the int32 ids). Rows:

- `.cache(dir)` (disk) on the stream, `.repeat(2)`: epoch 1 computes and writes the cache;
  epoch 2 reads it. Grain 0.2.18 has no disk cache: its in-memory `CacheIterDataset` over
  the same pipeline (`RepeatIterDataset` after it) is shown beside.
- `MapDataset.cache()`, iterated as a tf.data user does (`for epoch in range(2): for x in
  ds`), with seed 004's two placements: after the expensive map (the result fits in
  memory: epoch 2 is reads) and before it (the map grows the data: the cache holds the
  smaller tokenized elements and epoch 2 runs the map again); in this process, and with 2
  worker processes (`mp_prefetch`, which share one store in shared memory).
- `IterDataset.cache()` iterated the same way: its cache lives in one iterator, so each
  `for` (a new iterator) computes everything again.

"held" is what the cache holds (`CacheMapDataset.held`: element bytes in this process,
encoded bytes in the shared store).

    python benchmarks/bench_cache.py [--n 4000] [--work-us 300] [--out FILE]
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
from _harness import emit, machine, shared_data, table


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
    parser.add_argument("--out", type=Path, default=None)
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
        rows = [
            ["chute .cache(dir) (disk)", *_rates(n, c1, c2), f"{size / 1e6:.1f} MB (file)"],
            ["grain CacheIterDataset (memory)", *_rates(n, g1, g2), "-"],
        ]
        source = chute.MapDataset.source(records).map(json.loads).map(tokenize)
        placements = {
            "after the map": lambda: source.map(expensive).cache(),
            "before the map": lambda: source.cache().map(expensive),
        }
        for workers in (0, 2):
            for where, make in placements.items():
                ds = make()
                t1, t2 = for_each_epoch(_reader(ds, workers))
                held = _held(ds)
                name = f"chute MapDataset.cache() {where}, {workers} workers"
                rows.append([name, *_rates(n, t1, t2), f"{held / 1e6:.1f} MB"])
        stream = source.map(expensive).to_iter_dataset(chute.ReadOptions(num_threads=0)).cache()
        t1, t2 = for_each_epoch(stream)
        rows.append(["chute IterDataset.cache(), a for per epoch", *_rates(n, t1, t2), "-"])
    lines = [
        machine(),
        f"{n} records, ~{args.work_us:.0f} us of work per element",
        table(["cache", "epoch 1 el/s", "epoch 2 el/s", "epoch 2 speedup", "held"], rows),
    ]
    emit(lines, args.out)


def _rates(n: int, t1: float, t2: float) -> list[str]:
    return [f"{n / t1:,.0f}", f"{n / t2:,.0f}", f"{t1 / t2:.1f}x"]


def _reader(ds: Any, workers: int) -> Any:
    it = ds.to_iter_dataset(chute.ReadOptions(num_threads=0))
    if workers:
        it = it.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    return it


def _held(ds: Any) -> int:
    """The bytes the pipeline's cache holds, found through the node protocol."""
    stack = [ds]
    while stack:
        node = stack.pop()
        held = getattr(node, "held", None)
        if held is not None:
            return int(held[1])
        stack.extend(node.parents)
    return 0


def for_each_epoch(ds: Any) -> tuple[float, float]:
    """The times of two epochs as a tf.data user writes them: a `for` per epoch."""
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        for _ in ds:
            pass
        times.append(time.perf_counter() - t0)
    return times[0], times[1]


if __name__ == "__main__":
    main()
