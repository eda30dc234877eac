"""What debug mode (per-stage statistics) costs, and whether its advice is right.

`--cases overhead` (the cost):

The same pipelines iterated with `py_debug_mode` off and on, interleaved in one run:
- map-side: range -> shuffle -> map -> map -> to_iter_dataset (block-timed MapDataset
  stages), and
- iter-side: range -> to_iter_dataset -> map -> filter -> map_with_index (an element-timed
  proxy around every IterDataset stage).
Overhead per element per stage = (1/rate_on - 1/rate_off) / number of stages. Off costs
nothing by construction (the choice is made once, in `__iter__`); the "off" row is the
reference.

`--cases advice` (the diagnosis): seed 003's text pipeline (ArrayRecord source of the
shared corpus, json.loads, tokenize with bert-base-uncased, shuffle(42), repeat, trim to
128 tokens, first-fit packing into 30 bins, batch 512) run the ways a user tries it, each
for `--seconds` after its first batch, with the rate the consumer got and the summary's
advice beside it:
- threads: `ReadOptions(num_threads=0)` and `num_threads=24` (the seed's "GIL-free"
  advice; tokenize holds the GIL, so the threads wait for it);
- prefetch: `num_threads=0` then `.prefetch(4)` (`ThreadPrefetchIterDataset`) under a
  training loop whose step (a sleep, as a step on an accelerator) takes four times the
  batch's preparation at the best rate measured without threads (the load varies), for
  three times `--seconds`: the loop hardly waits, so no stage is a bottleneck;
- workers: `mp_prefetch` with 0, 2 and 16 workers: on a machine with 2 cores shared with
  other processes, workers can be slower than none, and 16 exceed the cores;
- cheap elements (range, +1, batch 512) with 0 and 2 workers: handing elements over costs
  far more than computing them, so workers slow the run.
Settings alternate over `--rounds` rounds (a burst of load from elsewhere hits each in
turn); the table gives every round, the advice is the last round's. The load average and
the usable cores are printed with each case: the advice must be right on a busy machine
too.

    python benchmarks/bench_stats.py [--cases overhead,advice] [--n 200000] [--seconds 6]
        [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import chute
from _corpus import Tokenize, corpus_array_record, tokenizer_path
from _harness import machine, rates, table

RECORDS = 120_000
SEQ_LEN = 128
BATCH = 512


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


def overhead(args: argparse.Namespace) -> None:
    n = args.n
    print(f"# overhead: {n:,} elements, best of {args.repeats}")
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


# -- the advice on seed 003's pipeline -----------------------------------------------------


def trim(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"description": element["description"][:SEQ_LEN]}


def text(threads: int) -> chute.IterDataset[Any]:
    """Seed 003's pipeline as its notebook writes it, read with `threads` threads."""
    source = chute.sources.ArrayRecordDataSource(str(corpus_array_record(RECORDS)))
    ds = chute.MapDataset.source(source).map(json.loads).map(Tokenize(str(tokenizer_path())))
    ds = ds.shuffle(seed=42).repeat(num_epochs=100)
    it_ds = ds.map(trim).to_iter_dataset(chute.ReadOptions(num_threads=threads))
    packed = chute.experimental.FirstFitPackIterDataset(
        it_ds, length_struct={"description": SEQ_LEN}, num_packing_bins=30
    )
    return packed.batch(BATCH, drop_remainder=True)


def measure(ds: chute.IterDataset[Any], seconds: float, step_s: float = 0.0) -> tuple[float, Any]:
    """Rows/s (a batch's leading dimension) the consumer got over `seconds` after its first batch (a training step of
    `step_s` per batch), and the stats of that run."""
    chute.config.update("py_debug_mode", True)
    try:
        it = iter(ds)
        next(it)
        t0, rows = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            batch = next(it)
            rows += len(batch["description"] if isinstance(batch, dict) else batch)
            if step_s:
                time.sleep(step_s)
        rate = rows / (time.perf_counter() - t0)
        stats = chute.stats(it)
        it.close()
    finally:
        chute.config.update("py_debug_mode", False)
    return rate, stats


def report(case: str, runs: dict[str, list[tuple[float, Any]]]) -> None:
    """Each setting's rounds (rows/s, consumer's waiting share, recommendation), then the
    advice of its last round."""
    cores = len(os.sched_getaffinity(0))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n## {case}\n({cores} usable cores; load average after it {load})\n")
    rows = []
    for name, rounds in runs.items():
        for k, (rate, stats) in enumerate(rounds, 1):
            waiting = stats.waiting_percent
            shown = f"{waiting:.1f}%" if waiting is not None else "-"
            rows.append([name, str(k), f"{rate:,.0f}", shown, str(stats.recommendation)])
    print(table(["setting", "round", "rows/s", "consumer waited", "recommendation"], rows))
    for name, rounds in runs.items():
        print(f"\n{name} (round {len(rounds)}):")
        advice = rounds[-1][1].advice()
        print(textwrap.fill(advice, 96, initial_indent="  ", subsequent_indent="  "))


def rounds(
    settings: dict[str, Any], n: int, seconds: float, step_s: float = 0.0
) -> dict[str, list[tuple[float, Any]]]:
    """`n` rounds of every setting (a function building the dataset), alternating, so that
    a burst of load from elsewhere hits each in turn."""
    out: dict[str, list[tuple[float, Any]]] = {name: [] for name in settings}
    for _ in range(n):
        for name, build in settings.items():
            out[name].append(measure(build(), seconds, step_s))
    return out


def cheap(workers: int) -> chute.IterDataset[Any]:
    """Elements that cost next to nothing: handing them over is all the workers add."""
    ds = chute.MapDataset.range(10**9).map(inc).to_iter_dataset(chute.ReadOptions(num_threads=0))
    ds = ds.batch(BATCH)
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers)) if workers else ds


def advice(args: argparse.Namespace) -> None:
    s, n = args.seconds, args.rounds
    threads = rounds({"num_threads=0": lambda: text(0), "num_threads=24": lambda: text(24)}, n, s)
    report("threads: to_iter_dataset(ReadOptions(num_threads=...))", threads)

    zero_rate = max(rate for rate, _ in threads["num_threads=0"])
    step = 4 * BATCH / zero_rate  # the training step: four times the batch's preparation
    fed = rounds({".prefetch(4)": lambda: text(0).prefetch(4)}, n, 3 * s, step_s=step)
    report(f"prefetch: .prefetch(4), a training step of {step * 1e3:.0f} ms per batch", fed)

    def with_workers(k: int) -> Any:
        options = chute.MultiprocessingOptions(num_workers=k)
        return lambda: text(0).mp_prefetch(options) if k else text(0)

    workers = rounds({f"{k} workers": with_workers(k) for k in (0, 2, 16)}, n, s)
    report("workers: .mp_prefetch(MultiprocessingOptions(num_workers=...))", workers)

    cheap_runs = rounds({f"{k} workers": lambda k=k: cheap(k) for k in (0, 2)}, n, s)
    report("workers on elements that cost next to nothing (range, +1, batch 512)", cheap_runs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="overhead,advice")
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    chute.config.update("py_debug_summary_interval_s", 3600.0)
    print(f"# bench_stats\n# {machine()}")
    for case in args.cases.split(","):
        {"overhead": overhead, "advice": advice}[case](args)


if __name__ == "__main__":
    import contextlib

    with contextlib.redirect_stderr(open(os.devnull, "w")):
        main()
