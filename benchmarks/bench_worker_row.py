"""Seed 003's text pipeline with 2 worker processes: chute beside torch's DataLoader and
torchdata.nodes, in one run.

The pipeline: parse a JSON line, tokenize its description (bert-base-uncased,
`tokenizers`), trim and pad to 128, a global shuffle, batches of 512. Every contender
reads the same in-memory list of the corpus's JSON lines (120,000 records, the epoch
repeated), with 2 worker processes:

- `chute list`: `MapDataset.source(lines).shuffle(seed=0).repeat().map(example)
  .to_iter_dataset().batch(512).mp_prefetch(MultiprocessingOptions(num_workers=2))`,
  default ReadOptions;
- `chute crec`: the same reading chute's own `.crec` file of those lines;
- `torch DataLoader`: a map-style dataset, `batch_size=512, shuffle=True, num_workers=2,
  persistent_workers=True, drop_last=True`;
- `torchdata.nodes`: `SamplerWrapper(RandomSampler)` -> `Batcher(512)` ->
  `ParallelMapper(method="process", num_workers=2)` over batches of indices (each worker
  makes a whole batch, as torchdata's docs show) -> `Prefetcher` -> `Loader`.

And seed 003's packed variant (first-fit packing of the unpadded token rows into rows of
128, 30 bins, batches of 512 packed rows): chute's `FirstFitPackIterDataset` after the
workers' `to_iter_dataset()`, against torchdata.nodes with the tokenizing in
`ParallelMapper(method="process")` and the same first-fit rule written as a `BaseNode`
after it (torchdata has no packer; its docs extend the graph with a `BaseNode`), then
`Batcher` and `default_collate` (a `Mapper`), so that both give batches of arrays.

Each measurement runs in a fresh process: 2 s of warm-up after the first batch, then
10 s counted (examples, or packed rows, per second). Contenders alternate round by round;
the median of the rounds is reported, with the load average before and after. On a shared
machine compare the ratios within one run.

    .venv-test/bin/python benchmarks/bench_worker_row.py              # 3 rounds, ~8 minutes
    .venv-test/bin/python benchmarks/bench_worker_row.py --rounds 1 --seconds 3   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _corpus import OUT, corpus_jsonl, tokenizer_path
from _harness import machine, table

SEQ_LEN = 128
BATCH = 512
RECORDS = 120_000
EPOCHS = 10  # the epoch repeated: no contender reaches its end in a round
PADDED = ("chute list", "chute crec", "torch DataLoader", "torchdata.nodes")
PACKED = ("chute packed", "torchdata.nodes packed")

_TOKENIZER: Any = None


def _tokenize(line: bytes) -> np.ndarray:
    global _TOKENIZER
    if _TOKENIZER is None:  # once per process, on first use: the worker loads its own
        from tokenizers import Tokenizer

        _TOKENIZER = Tokenizer.from_file(str(tokenizer_path()))
    ids = _TOKENIZER.encode(json.loads(line)["description"]).ids[:SEQ_LEN]
    return np.asarray(ids, dtype=np.int32)


def example(line: bytes) -> dict[str, np.ndarray]:
    """One JSON line -> its description's tokens, trimmed and padded to 128."""
    tokens = _tokenize(line)
    padded = np.zeros(SEQ_LEN, dtype=np.int32)
    padded[: len(tokens)] = tokens
    return {"description": padded}


def tokens(line: bytes) -> dict[str, np.ndarray]:
    """One JSON line -> its description's tokens, trimmed to 128 (for packing)."""
    return {"description": _tokenize(line)}


def lines() -> list[bytes]:
    return corpus_jsonl(RECORDS).read_bytes().splitlines()


def crec_path() -> Path:
    path = OUT / f"corpus_{RECORDS}.crec"
    if not path.exists():
        from chute.records import RecordWriter

        tmp = path.with_suffix(".crec.tmp")
        with RecordWriter(tmp) as w:
            for line in lines():
                w.write(line)
        tmp.rename(path)
    return path


# -- the contenders ------------------------------------------------------------------------


def chute_pipeline(name: str) -> Iterator[Any]:
    import chute

    if name == "chute crec":
        source: Any = chute.sources.RecordFileDataSource(str(crec_path()))
    else:
        source = lines()
    ds = chute.MapDataset.source(source).shuffle(seed=0).repeat(EPOCHS)
    if name == "chute packed":
        it_ds = chute.experimental.FirstFitPackIterDataset(
            ds.map(tokens).to_iter_dataset(),
            length_struct={"description": SEQ_LEN},
            num_packing_bins=30,
        )
    else:
        it_ds = ds.map(example).to_iter_dataset()
    it_ds = it_ds.batch(BATCH, drop_remainder=True)
    return iter(it_ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))


class LinesDataset:
    """torch's map-style dataset over the in-memory lines, the epoch repeated."""

    def __init__(self, fn: Any) -> None:
        self.lines = lines()
        self.fn = fn

    def __len__(self) -> int:
        return len(self.lines) * EPOCHS

    def __getitem__(self, i: int) -> Any:
        return self.fn(self.lines[i % len(self.lines)])


class MakeBatch:
    """torchdata.nodes' map function: a batch of indices -> the collated batch."""

    def __init__(self, ds: LinesDataset) -> None:
        self.ds = ds

    def __call__(self, indices: list[int]) -> Any:
        from torch.utils.data import default_collate

        return default_collate([self.ds[i] for i in indices])


class TokenRows:
    """torchdata.nodes' map function for packing: a batch of indices -> its token rows."""

    def __init__(self, ds: LinesDataset) -> None:
        self.ds = ds

    def __call__(self, indices: list[int]) -> list[Any]:
        return [self.ds[i] for i in indices]


class FirstFit:
    """Packs token rows first-fit into `bins` bins of SEQ_LEN; a row that fits in no bin
    emits every bin and starts new ones with it (the rule of chute's and Grain's
    FirstFitPackIterDataset, so both make the same rows), written as a torchdata.nodes
    `BaseNode`, with segment ids and positions as chute's packer gives them."""

    def __new__(cls, source: Any, bins: int = 30) -> Any:
        from torchdata.nodes import BaseNode

        class _FirstFit(BaseNode):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.source, self.bins = source, bins

            def reset(self, initial_state: dict[str, Any] | None = None) -> None:
                super().reset(initial_state)
                self.source.reset(None if initial_state is None else initial_state["source"])
                self.open: list[list[np.ndarray]] = []
                self.used: list[int] = []
                self.ready: list[dict[str, np.ndarray]] = []

            def _emit(self) -> None:
                for parts in self.open:
                    row = np.zeros(SEQ_LEN, dtype=np.int32)
                    segs = np.zeros(SEQ_LEN, dtype=np.int32)
                    pos = np.zeros(SEQ_LEN, dtype=np.int32)
                    at = 0
                    for s, part in enumerate(parts, start=1):
                        row[at : at + len(part)] = part
                        segs[at : at + len(part)] = s
                        pos[at : at + len(part)] = np.arange(len(part))
                        at += len(part)
                    self.ready.append(
                        {"description": row, "description_segment_ids": segs,
                         "description_positions": pos}
                    )  # fmt: skip
                self.open, self.used = [], []

            def next(self) -> dict[str, np.ndarray]:
                while not self.ready:
                    part = next(self.source)["description"]
                    k = next((j for j, u in enumerate(self.used) if u + len(part) <= SEQ_LEN), None)
                    if k is None:
                        if len(self.open) == self.bins:
                            self._emit()
                        self.open.append([])
                        self.used.append(0)
                        k = len(self.open) - 1
                    self.open[k].append(part)
                    self.used[k] += len(part)
                return self.ready.pop(0)

            def get_state(self) -> dict[str, Any]:
                return {"source": self.source.state_dict()}

        return _FirstFit()


def torch_pipeline(name: str) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader, RandomSampler, default_collate

    torch.set_num_threads(1)
    if name == "torch DataLoader":
        return iter(
            DataLoader(
                LinesDataset(example),
                batch_size=BATCH,
                shuffle=True,
                num_workers=2,
                persistent_workers=True,
                drop_last=True,
            )
        )
    from torchdata import nodes

    if name == "torchdata.nodes":
        ds = LinesDataset(example)
        node: Any = nodes.Batcher(nodes.SamplerWrapper(RandomSampler(ds)), BATCH, drop_last=True)
        node = nodes.ParallelMapper(node, MakeBatch(ds), num_workers=2, method="process")
        return iter(nodes.Loader(nodes.Prefetcher(node, prefetch_factor=2)))
    ds = LinesDataset(tokens)  # packed: tokenize in the workers a batch at a time, pack after
    node = nodes.Batcher(nodes.SamplerWrapper(RandomSampler(ds)), BATCH, drop_last=True)
    node = nodes.ParallelMapper(node, TokenRows(ds), num_workers=2, method="process")
    node = nodes.Batcher(FirstFit(nodes.Unbatcher(node)), BATCH, drop_last=True)
    # A batch of arrays per key, as chute's `batch` gives: Batcher gives a list of rows,
    # and torchdata's docs collate after it.
    node = nodes.Mapper(node, default_collate)
    return iter(nodes.Loader(nodes.Prefetcher(node, prefetch_factor=2)))


def rows_of(batch: Any) -> int:
    if isinstance(batch, list):
        return len(batch)
    return int(batch["description"].shape[0])


def child(name: str, warmup: float, seconds: float) -> None:
    make = chute_pipeline if name.startswith("chute") else torch_pipeline
    t_start = time.perf_counter()
    it = make(name)
    rows_of(next(it))
    first = time.perf_counter() - t_start
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        rows_of(next(it))
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        n += rows_of(next(it))
    print(json.dumps({"rate": n / elapsed, "first_batch_s": first}), flush=True)
    time.sleep(600)  # `measure` kills this process group, the workers with it


def profile_child(name: str, warmup: float, seconds: float) -> None:
    """Where the time of a 2-worker run goes: CPU seconds of the consumer and of its workers
    over the counted window (psutil), the user's map alone in this process, and the
    consumer's own functions (cProfile of the consumer thread). One JSON line."""
    import cProfile
    import io
    import pstats

    import psutil

    sample = lines()[:3000]
    t = time.process_time()
    for line in sample:
        example(line)
    map_us = (time.process_time() - t) / len(sample) * 1e6
    make = chute_pipeline if name.startswith("chute") else torch_pipeline
    it = make(name)
    rows_of(next(it))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        rows_of(next(it))
    me = psutil.Process()

    def cpu() -> tuple[float, float]:
        own = sum(me.cpu_times()[:2])
        kids = 0.0
        for c in me.children(recursive=True):
            try:
                kids += sum(c.cpu_times()[:2])
            except psutil.NoSuchProcess:
                pass
        return own, kids

    prof = cProfile.Profile()
    (own0, kids0), n, batches = cpu(), 0, 0
    t0 = time.perf_counter()
    prof.enable()
    while (elapsed := time.perf_counter() - t0) < seconds:
        n += rows_of(next(it))
        batches += 1
    prof.disable()
    own1, kids1 = cpu()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    top = [
        ln.strip()
        for ln in text.getvalue().splitlines()
        if ln.strip() and ln.strip()[0].isdigit() and "{" not in ln[:8]
    ]
    figures = {
        "rate": n / elapsed,
        "map_us_per_example": map_us,
        "workers_cpu_us_per_example": (kids1 - kids0) / n * 1e6,
        "workers_cores": (kids1 - kids0) / elapsed,
        "consumer_cpu_ms_per_batch": (own1 - own0) / batches * 1e3,
        "consumer_core_share": (own1 - own0) / elapsed,
        "consumer_top": top[:25],
    }
    print(json.dumps(figures), flush=True)
    time.sleep(600)


def profile(warmup: float, seconds: float) -> None:
    print(f"# {machine()}")
    print(f"# load average at start: {os.getloadavg()[0]:.2f}")
    rows = []
    for name in ("chute list", "torch DataLoader", "torchdata.nodes"):
        f = measure(name, warmup, seconds, "--profile-child")
        rows.append(
            [
                name,
                f"{f['rate']:,.0f}",
                f"{f['map_us_per_example']:.1f}",
                f"{f['workers_cpu_us_per_example']:.1f}",
                f"{f['workers_cpu_us_per_example'] - f['map_us_per_example']:.1f}",
                f"{f['workers_cores']:.2f}",
                f"{f['consumer_cpu_ms_per_batch']:.2f}",
                f"{f['consumer_core_share']:.2f}",
            ]
        )
        print(f"\n{name}: the consumer thread's functions by own time (cProfile; calls, tottime)")
        for ln in f["consumer_top"]:
            print("   ", ln[:150])
    print(f"# load average at end: {os.getloadavg()[0]:.2f}\n")
    print(
        table(
            [
                "contender",
                "examples/s",
                "map us/ex (alone)",
                "workers CPU us/ex",
                "workers' own us/ex",
                "workers' cores",
                "consumer CPU ms/batch",
                "consumer's cores",
            ],
            rows,
        )
    )


def measure(name: str, warmup: float, seconds: float, mode: str = "--child") -> dict[str, Any]:
    """One fresh process; its whole process group (its workers too) killed after. A run
    that gives no figure within a minute past its time (torchdata.nodes' process mapper
    hung so, once in a few runs on a loaded machine) is killed and run again, once."""
    for _attempt in (1, 2):
        argv = [sys.executable, __file__, mode, name, str(warmup), str(seconds)]
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], warmup + seconds + 60)
            if not ready:
                print(f"   ({name}: no figure after {warmup + seconds + 60:.0f} s: killed)")
                continue
            line = proc.stdout.readline()  # the child's one line (or "" if it died)
            if not line:
                proc.wait(timeout=60)
                raise RuntimeError(f"{name} failed:\n{proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
            return dict(json.loads(line))
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    raise RuntimeError(f"{name} hung twice")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--only", choices=("padded", "packed"), default=None)
    p.add_argument(
        "--profile", action="store_true", help="where the time goes, per contender (one run each)"
    )
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--profile-child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.profile_child:
        import bench_worker_row

        bench_worker_row.profile_child(
            args.profile_child[0], float(args.profile_child[1]), float(args.profile_child[2])
        )
        return
    if args.profile:
        profile(args.warmup, args.seconds)
        return
    if args.child:
        # Through the module's own name, not `__main__`, so that what the peers' workers
        # unpickle (`MakeBatch`, `LinesDataset`) resolves there as in any training script.
        import bench_worker_row

        bench_worker_row.child(args.child[0], float(args.child[1]), float(args.child[2]))
        return
    crec_path()  # written once, before any timing
    groups = {"padded": PADDED, "packed": PACKED}
    if args.only:
        groups = {args.only: groups[args.only]}
    print(f"# {machine()}")
    load0 = os.getloadavg()
    print(f"# load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}")
    results: dict[str, list[dict[str, float]]] = {}
    for r in range(args.rounds):
        for names in groups.values():
            for name in names:
                got = measure(name, args.warmup, args.seconds)
                results.setdefault(name, []).append(got)
                print(
                    f"round {r + 1} {name}: {got['rate']:,.0f}/s "
                    f"(first batch {got['first_batch_s']:.2f} s, load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    load1 = os.getloadavg()
    print(f"# load average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    for group, names in groups.items():
        unit = "examples/s" if group == "padded" else "packed rows/s"
        med = {n: statistics.median(x["rate"] for x in results[n]) for n in names}
        rows = []
        for n in names:
            rates = " / ".join(f"{x['rate']:,.0f}" for x in results[n])
            first = statistics.median(x["first_batch_s"] for x in results[n])
            ratios = "  ".join(
                f"{med[n] / med[m]:.2f}x {m}" for m in names if m != n and not m.startswith("chute")
            )
            rows.append([n, rates, f"{med[n]:,.0f}", f"{first:.2f}", ratios])
        print(f"\n## {group}: {unit}, 2 workers, {args.rounds} rounds of {args.seconds:g} s")
        print(table(["contender", f"{unit} per round", "median", "first batch s", "ratio"], rows))
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_worker_row.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
