"""Batches shaped by length: padding waste and tokens/s, beside fixed-size batches and packing.

Workload (seed 003): the shared corpus's descriptions, tokenized with the shared BERT
tokenizer (`tokenizers`) and cut to 128 tokens, held in memory, then batched with the same
budget of 4096 token slots per batch (32 rows of 128) in five ways:

- fixed 32 x 128: `batch(32, padding_struct=128)` (seed 003's padded rows);
- fixed 32, dynamic: `batch(32, pad_value=0)` (padded to each batch's longest);
- tokens: `batch_by_tokens(4096, window_size=1000, seed=0)`;
- buckets: `bucket_by_sequence_length` with boundaries 16/32/48/64/96 and batch sizes
  that fill 4096 slots at each boundary;
- packed: `FirstFitPackIterDataset` rows of 128 (32 bins), batched by 32.

Reported per way: batches (steps) per epoch, padding waste (padding slots / all slots),
all slots against fixed 32 x 128 batches (what a step's compute follows), the loader's
rate in real tokens per second (the pipeline alone), and the rate with a
stand-in training step whose cost follows the padded slots (two 64 x 64 matmuls per
slot): that is where less padding shows. Rates are per CPU second of this process
(`time.process_time`, so that other work on a shared machine does not count; the stand-in
step runs numpy's matmul on one thread: set OPENBLAS_NUM_THREADS=1), best of `--repeats`,
the ways interleaved round by round; compare ratios within one run.

    python benchmarks/bench_shaped_batches.py [--n 20000] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import chute
from _harness import emit, machine, shared_data, table

LENGTH = 128
ROWS = 32
BUDGET = ROWS * LENGTH
BOUNDS = [16, 32, 48, 64, 96]


def tokenized_corpus(n: int) -> list[dict[str, np.ndarray]]:
    from tokenizers import Tokenizer

    data = shared_data()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "corpus.jsonl"
        script = str(data / "make_corpus.py")
        subprocess.run([sys.executable, script, str(out), str(n)], check=True)
        texts = [json.loads(line)["description"] for line in out.read_text().splitlines()]
    tokenizer = Tokenizer.from_file(str(data / "bert-base-uncased.tokenizer.json"))
    return [
        {"description": np.asarray(e.ids[:LENGTH], dtype=np.int32)}
        for e in tokenizer.encode_batch(texts)
    ]


def _length(x: dict[str, np.ndarray]) -> int:
    return len(x["description"])


def pipelines(tokens: list[Any]) -> dict[str, Callable[[], Iterable[Any]]]:
    def source() -> chute.IterDataset[Any]:
        return chute.MapDataset.source(tokens).to_iter_dataset(chute.ReadOptions(num_threads=0))

    bucket_sizes = [BUDGET // (b - 1) for b in BOUNDS] + [ROWS]
    return {
        "fixed 32 x 128": lambda: source().batch(ROWS, padding_struct={"description": LENGTH}),
        "fixed 32, dynamic": lambda: source().batch(ROWS, pad_value=0),
        "batch_by_tokens": lambda: source().batch_by_tokens(
            BUDGET, length_fn=_length, window_size=1000, seed=0
        ),
        "bucket_by_length": lambda: source().bucket_by_sequence_length(
            _length, BOUNDS, bucket_sizes, window_size=4000
        ),
        "packed 128": lambda: chute.experimental.FirstFitPackIterDataset(
            source(), length_struct={"description": LENGTH}, num_packing_bins=ROWS
        ).batch(ROWS),
    }


def _real_and_slots(batch: Any) -> tuple[int, int]:
    if "description_segment_ids" in batch:
        seg = batch["description_segment_ids"]
        return int(np.count_nonzero(seg)), int(seg.size)
    x = batch["description"]
    return int(np.count_nonzero(x)), int(x.size)


class StandInStep:
    """A step whose cost is the padded slots', whatever their values (a model computes on
    padding as on tokens): each slot becomes a row of 64 features, times a 64 x 64 matrix,
    twice. (An embedding gather would make padding cheaper than tokens: its one row stays
    in the CPU's cache.)"""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.weight = rng.standard_normal((64, 64), dtype=np.float32)

    def __call__(self, ids: np.ndarray) -> float:
        rows = np.broadcast_to(ids.reshape(-1, 1), (ids.size, 64)).astype(np.float32)
        h = np.tanh(rows @ self.weight) @ self.weight
        return float(h[0, 0])


def measure(
    make: Callable[[], Iterable[Any]], step: StandInStep | None
) -> tuple[int, int, int, float]:
    """(batches, real tokens, slots, CPU seconds) of one epoch."""
    batches = real = slots = 0
    t0 = time.process_time()
    for batch in make():
        r, s = _real_and_slots(batch)
        batches, real, slots = batches + 1, real + r, slots + s
        if step is not None:
            step(batch["description"])
    return batches, real, slots, time.process_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    tokens = tokenized_corpus(args.n)
    ways = pipelines(tokens)
    step = StandInStep()
    loader = dict.fromkeys(ways, float("inf"))
    trained = dict.fromkeys(ways, float("inf"))
    shape: dict[str, tuple[int, int, int]] = {}
    for _ in range(args.repeats):
        for name, make in ways.items():
            b, r, s, t = measure(make, None)
            shape[name] = (b, r, s)
            loader[name] = min(loader[name], t)
            trained[name] = min(trained[name], measure(make, step)[3])
    real = shape["fixed 32 x 128"][1]
    rows = []
    for name in ways:
        b, r, s = shape[name]
        rows.append(
            [
                name,
                str(b),
                f"{100 * (s - r) / s:.1f} %",
                f"{s / shape['fixed 32 x 128'][2]:.2f}",
                f"{r / loader[name] / 1e6:.2f} M",
                f"{r / trained[name] / 1e6:.3f} M",
                f"{trained['fixed 32 x 128'] / trained[name]:.2f}",
            ]
        )
        assert r == real, (name, r, real)  # every way hands out every token once
    lines = [
        machine(),
        f"seed 003 corpus: {args.n} descriptions, {real} tokens (cut to {LENGTH}), "
        f"mean length {real / args.n:.1f}; budget {BUDGET} slots per batch; "
        f"best of {args.repeats}",
        table(
            [
                "batching",
                "batches",
                "padding waste",
                "slots vs 32 x 128",
                "loader tokens/s",
                "tokens/s with stand-in step",
                "step speed-up vs 32 x 128",
            ],
            rows,
        ),
    ]
    emit(lines, args.out)


if __name__ == "__main__":
    main()
