"""Packing throughput: chute's first-fit and best-fit packing beside Grain 0.2.18's.

Workload (issue 5, seed 003): the shared corpus's descriptions, tokenized once with the
shared BERT tokenizer and cut to 128 tokens, held in memory; then
`MapDataset.source(tokens).to_iter_dataset()` packed into rows of 128 with 30 and 512
bins (default bin shuffling), every row consumed. Only packing is timed, identically for
both libraries. Reported: input sequences per second and row fill (non-padding tokens /
row capacity), best of `--repeats`.

    python benchmarks/bench_pack.py [--n 20000] [--repeats 2]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import chute
from _harness import machine, shared_data, table

LENGTH = 128


def tokenized_corpus(n: int) -> list[dict[str, np.ndarray]]:
    from tokenizers import Tokenizer

    data = shared_data()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "corpus.jsonl"
        script = str(data / "make_corpus.py")
        subprocess.run([sys.executable, script, str(out), str(n)], check=True)
        texts = [json.loads(line)["description"] for line in out.read_text().splitlines()]
    tokenizer = Tokenizer.from_file(str(data / "bert-base-uncased.tokenizer.json"))
    return [{"description": np.asarray(e.ids[:LENGTH])} for e in tokenizer.encode_batch(texts)]


def run_chute(tokens: list[Any], best: bool, bins: int) -> tuple[int, int]:
    cls = (
        chute.experimental.BestFitPackIterDataset
        if best
        else chute.experimental.FirstFitPackIterDataset
    )
    ds = chute.MapDataset.source(tokens).to_iter_dataset(chute.ReadOptions(num_threads=0))
    packed = cls(ds, length_struct={"description": LENGTH}, num_packing_bins=bins)
    return _consume(packed)


def run_grain(tokens: list[Any], best: bool, bins: int) -> tuple[int, int]:
    import grain

    cls = (
        grain.experimental.BestFitPackIterDataset
        if best
        else grain.experimental.FirstFitPackIterDataset
    )
    ds = grain.MapDataset.source(tokens).to_iter_dataset(grain.ReadOptions(num_threads=0))
    packed = cls(ds, length_struct={"description": LENGTH}, num_packing_bins=bins)
    return _consume(packed)


def _consume(packed: Any) -> tuple[int, int]:
    rows = tokens = 0
    for row in packed:
        rows += 1
        tokens += int(np.count_nonzero(row["description_segment_ids"]))
    return rows, tokens


def best_of(
    fn: Callable[[list[Any], bool, int], tuple[int, int]],
    tokens: list[Any],
    best: bool,
    bins: int,
    repeats: int,
) -> tuple[float, float]:
    rate, fill = 0.0, 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows, used = fn(tokens, best, bins)
        rate = max(rate, len(tokens) / (time.perf_counter() - t0))
        fill = used / (rows * LENGTH)
    return rate, fill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    tokens = tokenized_corpus(args.n)
    total = sum(len(t["description"]) for t in tokens)
    print(machine())
    print(f"{len(tokens)} sequences, {total} tokens (mean {total / len(tokens):.1f}), rows of 128")
    rows = []
    for best in (False, True):
        for bins in (30, 512):
            c_rate, c_fill = best_of(run_chute, tokens, best, bins, args.repeats)
            g_rate, g_fill = best_of(run_grain, tokens, best, bins, args.repeats)
            name = "best-fit" if best else "first-fit"
            rows.append(
                [
                    name,
                    str(bins),
                    f"{c_rate:,.0f}",
                    f"{g_rate:,.0f}",
                    f"{c_rate / g_rate:.1f}x",
                    f"{c_fill:.1%}",
                    f"{g_fill:.1%}",
                ]
            )
    headers = [
        "packing",
        "bins",
        "chute seq/s",
        "grain seq/s",
        "speedup",
        "chute fill",
        "grain fill",
    ]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
