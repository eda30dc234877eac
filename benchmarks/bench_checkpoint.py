"""What a checkpoint costs: iterator state of seed 003's packed text pipeline, 2 workers.

The pipeline is `bench_mp.py`'s "packed" text pipeline (seed 003's: ArrayRecord of JSON
records, parse, tokenize with bert-base-uncased, shuffle(42), repeat, shard [1::16], trim to
128, first-fit pack (30 bins) into 128, batch 512), with `mp_prefetch` and 2 workers, for
chute and for Grain 0.2.18. torchdata's `StatefulDataLoader` (`num_workers=2`, default
`snapshot_every_n_steps=1`, and 64 for comparison) runs the same per-record work in a
map-style torch Dataset (`bench_torch.TorchText`: parse, tokenize, trim, pad to 128),
`shuffle=True`, batch 512: torch has no packing, and the whole corpus is read rather than
shard 1 of 16 (a shard of 120k records is only 14 batches of 512).

For each library, after a warm-up of some batches:

- `get_state()` (torch: `state_dict()`) timed `--calls` times, after every other `next(it)`
  (the mean `next` right after a state and otherwise is reported too: for torch both
  include its per-step snapshots);
  the state's size: chute/Grain `len(json.dumps(state))`, torch `torch.save` bytes (the
  largest over all calls);
- chute: `chute.checkpoint.save(path, it)` (JSON file, fsynced, atomic `os.replace`);
  torch: `torch.save(state_dict, path)` (no fsync, not atomic); Grain saves through Orbax
  only (not measured here);
- restore: states taken at several points; each restored on a fresh iterator (torch: a
  fresh StatefulDataLoader) with `set_state` (`load_state_dict`), timed from creating the
  iterator to its first batch, which is checked against the batch the original iterator
  gave after that state. Beside it, a fresh iterator's first batch without a restore (the
  worker start-up both include). Restores run round by round, libraries interleaved.

    .venv/bin/python benchmarks/bench_checkpoint.py                # ~4 minutes
    .venv/bin/python benchmarks/bench_checkpoint.py --quick --lib chute   # smoke run
"""

from __future__ import annotations

import abc
import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_mp
import bench_torch
import chute
import chute.checkpoint
from _corpus import corpus_array_record
from _harness import machine, table

BATCH = bench_mp.BATCH
LIBS = ("chute", "grain", "torch", "torch64")
TORCH_SNAPSHOTS = {"torch": 1, "torch64": 64}


@dataclass
class Result:
    label: str
    next_s: list[float] = field(default_factory=list)  # next() right after a get_state
    plain_next_s: list[float] = field(default_factory=list)  # the other next() calls
    get_state_s: list[float] = field(default_factory=list)
    state_bytes: list[int] = field(default_factory=list)
    save_s: list[float] = field(default_factory=list)
    # (state, the batch that followed it)
    points: list[tuple[Any, Any]] = field(default_factory=list)
    fresh_s: list[float] = field(default_factory=list)
    set_state_s: list[float] = field(default_factory=list)
    restore_s: list[float] = field(default_factory=list)
    mismatches: int = 0


# -- the contenders ------------------------------------------------------------------------


class Contender(abc.ABC):
    """One library's iterator: make, next, state, save (where `can_save`), restore."""

    label = ""
    can_save = True

    def __init__(self, records: int) -> None:
        self.records = records

    @abc.abstractmethod
    def make(self) -> Any:
        """A fresh iterator."""

    def state(self, it: Any) -> Any:
        return it.get_state()

    def size(self, state: Any) -> int:
        return len(json.dumps(state))

    @abc.abstractmethod
    def save(self, it: Any, path: Path) -> None:
        """Writes the iterator's state to `path` (called only where `can_save`)."""

    def set_state(self, it: Any, state: Any) -> None:
        it.set_state(state)

    def close(self, it: Any) -> None:
        bench_mp.close(it)

    def same(self, a: Any, b: Any) -> bool:
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


class ChuteOrGrain(Contender):
    def __init__(self, lib: str, records: int) -> None:
        super().__init__(records)
        self.lib = lib
        self.label = f"{lib} (packed, mp_prefetch 2 workers)"
        self.can_save = lib == "chute"  # Grain saves through Orbax only: not measured
        self.ds = bench_mp.text_pipeline(lib, workers=2, packed=True, records=records)

    def make(self) -> Any:
        return iter(self.ds)

    def save(self, it: Any, path: Path) -> None:
        chute.checkpoint.save(path, it)


class TorchLoader(Contender):
    """A StatefulDataLoader over `bench_torch.TorchText`; the "iterator" is the loader
    (its `state_dict()` is the loader's), iterated through `self.iters[loader]`."""

    def __init__(self, records: int, snapshot_every: int) -> None:
        super().__init__(records)
        self.snapshot_every = snapshot_every
        self.label = f"torchdata (padded, 2 workers, snapshot every {snapshot_every})"
        self.path = corpus_array_record(records)
        self.iters: dict[int, Any] = {}

    def loader(self) -> Any:
        import torch
        from torchdata.stateful_dataloader import StatefulDataLoader

        g = torch.Generator()
        g.manual_seed(42)
        return StatefulDataLoader(
            bench_torch.TorchText(self.path),  # type: ignore[arg-type]
            batch_size=BATCH,
            shuffle=True,
            generator=g,
            drop_last=True,
            num_workers=2,
            # fork segfaults here (array_record's reader opened in the parent for len())
            multiprocessing_context="forkserver",
            snapshot_every_n_steps=self.snapshot_every,
        )

    def make(self) -> Any:
        return _TorchIter(self.loader())

    def state(self, it: Any) -> Any:
        return it.loader.state_dict()

    def size(self, state: Any) -> int:
        import torch

        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.tell()

    def save(self, it: Any, path: Path) -> None:
        import torch

        torch.save(it.loader.state_dict(), path)

    def set_state(self, it: Any, state: Any) -> None:
        it.loader.load_state_dict(state)

    def close(self, it: Any) -> None:
        it.close()

    def same(self, a: Any, b: Any) -> bool:
        return bool((a["description"] == b["description"]).all())


class _TorchIter:
    """A loader and its iterator, started on the first `next` (after any
    `load_state_dict`), as a training loop would use it."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._it: Any = None

    def __next__(self) -> Any:
        if self._it is None:
            self._it = iter(self.loader)
        return next(self._it)

    def close(self) -> None:
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def contender(lib: str, records: int) -> Contender:
    if lib in TORCH_SNAPSHOTS:
        return TorchLoader(records, TORCH_SNAPSHOTS[lib])
    return ChuteOrGrain(lib, records)


# -- measuring -----------------------------------------------------------------------------


def iterate(c: Contender, cfg: argparse.Namespace, tmp: Path) -> Result:
    """Warm-up, then `cfg.calls` of next + state, `cfg.saves` saves spread among them, and
    `cfg.points` states (with the batch after each) kept for the restores. The next()
    calls are timed too, apart by whether a state was taken just before."""
    r = Result(c.label)
    it = c.make()
    try:
        for _ in range(cfg.warmup):
            next(it)
        every_save = max(1, cfg.calls // max(1, cfg.saves))
        keep = {round(k * (cfg.calls - 1) / max(1, cfg.points - 1)) for k in range(cfg.points)}
        after_state = False
        for step in range(2 * cfg.calls):
            t0 = time.perf_counter()
            next(it)
            (r.next_s if after_state else r.plain_next_s).append(time.perf_counter() - t0)
            # States after steps 1, 2, 5, 6, ...: both kinds of step fall on odd and even
            # steps alike (with 2 workers taking turns, parity alone changes next's time).
            after_state = step % 4 in (1, 2)
            if not after_state:
                continue
            k = len(r.get_state_s)
            t1 = time.perf_counter()
            state = c.state(it)
            r.get_state_s.append(time.perf_counter() - t1)
            r.state_bytes.append(c.size(state))
            if c.can_save and k % every_save == 0 and len(r.save_s) < cfg.saves:
                t0 = time.perf_counter()
                c.save(it, tmp / f"ckpt_{k}")
                r.save_s.append(time.perf_counter() - t0)
            if k in keep:
                batch = next(it)  # not timed
                r.points.append((state, batch))
                after_state = False
    finally:
        c.close(it)
    return r


def restore(c: Contender, r: Result, point: int) -> None:
    state, expected = r.points[point]
    t0 = time.perf_counter()
    it = c.make()
    try:
        t1 = time.perf_counter()
        c.set_state(it, state)
        t2 = time.perf_counter()
        batch = next(it)
        t3 = time.perf_counter()
    finally:
        c.close(it)
    r.set_state_s.append(t2 - t1)
    r.restore_s.append(t3 - t0)
    r.mismatches += not c.same(batch, expected)


def fresh_first(c: Contender, r: Result) -> None:
    t0 = time.perf_counter()
    it = c.make()
    try:
        next(it)
        r.fresh_s.append(time.perf_counter() - t0)
    finally:
        c.close(it)


def measure(cfg: argparse.Namespace) -> dict[str, Result]:
    contenders = {lib: contender(lib, cfg.records) for lib in cfg.lib}
    results: dict[str, Result] = {}
    with tempfile.TemporaryDirectory(prefix="chute-bench-ckpt-") as tmp:
        for lib, c in contenders.items():
            print(f"# iterating {lib} ...", file=sys.stderr, flush=True)
            results[lib] = iterate(c, cfg, Path(tmp))
    for _ in range(cfg.rounds):  # restores, libraries interleaved round by round
        for lib, c in contenders.items():
            print(f"# restoring {lib} ...", file=sys.stderr, flush=True)
            fresh_first(c, results[lib])
            for point in range(len(results[lib].points)):
                restore(c, results[lib], point)
    return results


# -- output --------------------------------------------------------------------------------


def ms(xs: list[float], f: Callable[[list[float]], float] = statistics.median) -> str:
    return f"{f(xs) * 1e3:.3f}" if xs else "-"


def secs(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} / {max(xs):.2f}" if xs else "-"


def report(results: dict[str, Result], cfg: argparse.Namespace) -> str:
    rows = []
    for r in results.values():
        restores = len(r.restore_s)
        rows.append(
            [
                r.label,
                f"{statistics.mean(r.plain_next_s) * 1e3:.0f} / "
                f"{statistics.mean(r.next_s) * 1e3:.0f}",
                ms(r.get_state_s),
                ms(r.get_state_s, max),
                f"{max(r.state_bytes):,}",
                ms(r.save_s),
                ms(r.set_state_s),
                secs(r.fresh_s),
                secs(r.restore_s),
                f"{restores - r.mismatches}/{restores}",
            ]
        )
    headers = [
        "library",
        "next ms mean: plain/after state",
        "get_state ms med",
        "get_state ms max",
        "state bytes",
        "save ms med",
        "set_state ms med",
        "fresh 1st batch s med/max",
        "restore to 1st batch s med/max",
        "restored batch right",
    ]
    lines = [
        f"## {cfg.calls} get_state calls after a warm-up of {cfg.warmup} batches, each after "
        f"a next(); {cfg.saves} saves among them; {len(next(iter(results.values())).points)} "
        f"states restored in each of {cfg.rounds} rounds (libraries interleaved); corpus "
        f"{cfg.records:,} records, batch {BATCH}",
        table(headers, rows),
    ]
    return "\n".join(lines)


NOTES = """\
notes:
- chute/grain rows: seed 003's packed pipeline (first-fit, 30 bins, 128 tokens) with
  mp_prefetch(2 workers). torch rows: padded to 128, no packing (torch has none), the whole
  corpus shuffled (not shard 1 of 16), forkserver workers; state bytes are torch.save's.
- get_state/state_dict is timed alone, after every other next() (in the pattern
  next, next+state, next+state, next, ...). "next ms": the mean next() of the steps not
  right after a state / right after one (for torchdata both include the worker snapshots
  it sends with every snapshot_every_n_steps-th batch). chute packs and batches in the main process (its
  workers compute the per-record maps), Grain's workers run the whole pipeline and buffer
  whole batches: their "next ms" differ for that reason, not for the checkpoints.
- save: chute.checkpoint.save (JSON, fsync, atomic replace); torch: torch.save to a file
  (no fsync, not atomic); Grain checkpoints through Orbax only: not measured ("-").
- restore: from creating a fresh iterator (torch: a fresh StatefulDataLoader) to its first
  batch after set_state/load_state_dict, worker start-up included: compare it with
  "fresh 1st batch" (a fresh iterator, no restore). "restored batch right": that batch
  equals the one the original iterator gave after the state was taken.
- a shared 2-core machine: compare figures within this run, not across runs."""


def configure(args: argparse.Namespace) -> argparse.Namespace:
    """Sizes for `measure`: `args.quick`, and `lib`/`calls`/`rounds` where not set."""
    quick = args.quick
    args.lib = getattr(args, "lib", None) or list(LIBS)
    args.records = 20_000 if quick else bench_mp.CORPUS_RECORDS
    args.warmup = 3 if quick else 10
    args.calls = getattr(args, "calls", None) or (10 if quick else 50)
    args.saves = 3 if quick else 10
    args.points = 2 if quick else 3
    args.rounds = getattr(args, "rounds", None) or (1 if quick else 2)
    return args


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--lib", action="append", choices=LIBS, help="only this contender (repeatable)")
    p.add_argument("--calls", type=int, default=None, help="get_state calls (default 50)")
    p.add_argument("--rounds", type=int, default=None, help="restore rounds (default 2)")
    args = configure(p.parse_args())
    warnings.filterwarnings("ignore")
    quick = args.quick
    print(f"# bench_checkpoint{' --quick' if quick else ''}: what a checkpoint costs")
    print(f"# {machine()}, torchdata {_version('torchdata')}")
    print(f"# chute checkout: {bench_mp.revision()}", flush=True)
    corpus_array_record(args.records)
    t0 = time.perf_counter()
    results = measure(args)
    print(report(results, args))
    print(NOTES)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    bad = [lib for lib, r in results.items() if r.mismatches]
    if bad:
        print(f"RESTORED BATCHES DIFFER: {', '.join(bad)}")
        sys.exit(1)


def _version(pkg: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":
    main()
