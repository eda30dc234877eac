"""The whole benchmark suite in one run: chute beside Grain 0.2.18 and the PyTorch DataLoader.

    .venv/bin/pip install -e '.[bench]'           # grain, torch (CPU), matplotlib, ...
    .venv/bin/python benchmarks/run_all.py --quick  # ~3 minutes
    .venv/bin/python benchmarks/run_all.py          # ~10 minutes

Prints ONE table, each workload a row: each library's figure and chute's ratio to the
others (above 1: chute is better, whichever way the unit goes). Everything is measured in
this run, contenders interleaved round by round with the best round kept, so a burst of
load elsewhere on a shared machine hits everyone: read the ratios, not the absolutes.
Writes `bench_out/suite.json` (the machine, the options, every figure) and
`bench_out/suite.png` (the ratios).

Workloads (`--only NAME`, repeatable):

- `overhead`: range, shuffle, cheap map, batch 32 (`bench_core.py`'s functions; torch: a
  map-style Dataset in a DataLoader); elements/s.
- `text`: seed 003's pipeline (see `bench_torch.py`), no worker process: chute and Grain
  with 0 and 2 threads, torch with 0 and 2 workers, each library's best; rows/s. Also
  the time to the first batch of a fresh iterator (0 workers/threads).
- `image`: JPEG decode, random crop, flip, batch 64 (`bench_image.py`), 0 and 2 workers;
  images/s. Also gives `first batch`: seconds from creating the first 2-worker iterator
  to its first batch (worker start-up included).
- `transfer`: 16 MiB arrays made in 2 worker processes, GB/s at the consumer.
- `storage`: random single-record reads from each format chute reads (.crec, ArrayRecord,
  JSONL, Parquet, TFRecord), on the shared corpus; Grain only reads ArrayRecord at
  random, torch has no reader of its own (`-`).
- `waiting`: seed 003's "waiting for data" loop: a train step twice as long as a batch
  takes, with a background prefetch of 3 batches (chute/Grain:
  `ThreadPrefetchIterDataset(ds, 3)`; torch: `num_workers=1, prefetch_factor=3`) on the
  image pipeline; % of the time spent waiting.
- `checkpoint`: `bench_checkpoint.py`: seed 003's first-fit packed text pipeline with 2
  worker processes (torch: padded, torchdata's `StatefulDataLoader`, default
  `snapshot_every_n_steps=1`): median `get_state()` (`state_dict()`) time, and the time
  from a fresh iterator with a restored state to its first batch.

Four more peers, in a table of their own (`--peers` adds them to the run, `--only peers`
runs them alone; `peers.py` tells how each is written): SPDL 0.8.0, torchdata 0.11.0's
`torchdata.nodes`, MosaicML Streaming 0.13.0 and LitData 0.2.76, beside chute on the
per-element overhead, seed 003's text pipeline with 0 and 2 workers, images with 2
processes and 2 threads, and a converted corpus streamed with 2 workers. They pull their
own torch, so they run from a virtualenv of their own, made once from the checkout:

    python3 -m venv .venv-peers
    .venv-peers/bin/pip install -e . tokenizers pillow array-record psutil \\
        torch==2.14.1 torchvision==0.29.1 spdl==0.8.0 torchdata==0.11.0 \\
        mosaicml-streaming==0.13.0 litdata==0.2.76
    .venv/bin/python benchmarks/run_all.py --only peers   # ~9 minutes; --quick: ~4

(A virtualenv elsewhere: name it with CHUTE_PEERS_VENV=/path. PyPI's torch and torchvision
are the pair built for each other and run without a GPU; a `+cpu` torch beside PyPI's
torchvision fails at `import torchvision`, which Streaming needs: see `peers.py`.)

Each measurement, chute's too, runs in a fresh `.venv-peers` process; each figure is the
median of 5 rounds (3 with `--quick`; `--peer-rounds`) after a warm-up round, the
contenders alternating, their order turning each round; the table gives each row's
spread (slowest to fastest round over the median, the widest contender's) and the
1-minute load average at its start and end. A peer whose slowest round beats chute's
fastest is named in the note as winning beyond the noise. Without the virtualenv the
peers' rows are skipped (exit status 1) with a message naming that command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import statistics
import struct
import sys
import tempfile
import textwrap
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_checkpoint
import bench_core
import bench_image
import bench_torch
import chute
import chute.cli
from _harness import machine, rates, table

OUT = Path(__file__).resolve().parents[1] / "bench_out"
LIBS = ("chute", "grain", "torch")
SECTIONS = ("overhead", "text", "image", "transfer", "storage", "waiting", "checkpoint")
PEER_LIBS = ("chute", "spdl", "torchdata.nodes", "mosaic", "litdata")  # peers.PEERS
PEER_SECTION = "peers"


@dataclass
class Row:
    workload: str
    unit: str
    values: dict[str, float | None]  # library -> figure; None: not measured / no such thing
    higher_is_better: bool = True
    note: str = ""
    spread: str = ""  # peers' rows: the widest spread of a contender's rounds
    load: str = ""  # peers' rows: 1-minute load average at the row's start and end
    rounds: dict[str, list[float]] = field(default_factory=dict)  # peers' rows

    def ratio(self, other: str) -> float | None:
        c, o = self.values.get("chute"), self.values.get(other)
        if not c or not o:
            return None
        return c / o if self.higher_is_better else o / c


# -- sections ------------------------------------------------------------------------------


def section_overhead(quick: bool) -> list[Row]:
    n = 50_000 if quick else 200_000
    r = rates(
        {
            "chute": lambda: bench_core.chute_dataset(n),
            "grain": lambda: bench_core.grain_dataset(n),
            "torch": lambda: bench_torch.torch_overhead(n),
            "chute_dl": lambda: bench_core.chute_loader(n),
        },
        repeats=2 if quick else 3,
    )
    n_dl = 10_000 if quick else 50_000  # Grain's DataLoader is ~100x slower: fewer elements
    grain_dl = rates({"grain_dl": lambda: bench_core.grain_loader(n_dl)}, 1)["grain_dl"]
    return [
        Row(
            "overhead: range/shuffle/map/batch 32, Dataset API",
            "elem/s",
            {k: r[k] for k in LIBS},
            note="torch: DataLoader",
        ),
        Row(
            "overhead: the same, DataLoader API",
            "elem/s",
            {"chute": r["chute_dl"], "grain": grain_dl, "torch": r["torch"]},
        ),
    ]


def section_text(quick: bool) -> list[Row]:
    _, ar = bench_torch.corpus()
    seconds, rounds = (1.5, 2) if quick else (4.0, 3)
    runs: dict[str, Callable[[], tuple[float, float]]] = {}
    for lib in LIBS:
        for parallel in (0, 2):
            runs[f"{lib}|{parallel}"] = lambda lib=lib, p=parallel: bench_torch.rate_after_first(
                bench_torch.text_iter(lib, ar, p), seconds, size=bench_torch.text_rows
            )
    best = dict.fromkeys(runs, 0.0)
    first: dict[str, float] = {}
    for _ in range(rounds):
        for key, run in runs.items():
            rate, first_s = run()
            best[key] = max(best[key], rate)
            first[key] = min(first.get(key, first_s), first_s)
    values: dict[str, float | None] = {}
    configs = []
    for lib in LIBS:
        p = max((0, 2), key=lambda p: best[f"{lib}|{p}"])
        values[lib] = best[f"{lib}|{p}"]
        configs.append(f"{lib} {p} {'workers' if lib == 'torch' else 'threads'}")
    return [
        Row(
            "seed 003 text pipeline, batch 512 (best config)",
            "rows/s",
            values,
            note="; ".join(configs),
        ),
        Row(
            "time to first batch: seed 003 text, 0 workers/threads",
            "s",
            {lib: first[f"{lib}|0"] for lib in LIBS},
            higher_is_better=False,
            note="fresh iterator, best round",
        ),
    ]


def section_image(quick: bool) -> list[Row]:
    res = bench_image.measure(quick)
    first = res.pop("first batch, 2 workers")
    rows = [
        Row(f"image: JPEG decode+crop+flip, batch 64, {k}", "img/s", dict(v))
        for k, v in res.items()
    ]
    rows.append(
        Row(
            "time to first batch: image, 2 workers",
            "s",
            dict(first),
            higher_is_better=False,
            note="first 2-worker iterator in the process",
        )
    )
    return rows


def section_transfer(quick: bool) -> list[Row]:
    seconds, rounds = (1.5, 2) if quick else (3.0, 3)
    best: dict[str, float | None] = {}
    for _ in range(rounds):
        for lib in LIBS:
            rate, _ = bench_torch.rate_after_first(
                bench_torch.transfer_iter(lib, 2),
                seconds,
                size=lambda a: a.nbytes,
                touch=lambda a: float(a[0, 0]),
            )
            best[lib] = max(best.get(lib) or 0.0, rate / 1e9)
    return [Row("transfer: 16 MiB arrays from 2 worker processes", "GB/s", best)]


def _write_tfrecord(path: Path, records: list[bytes]) -> None:
    import crc32c

    def masked(data: bytes) -> bytes:
        crc = crc32c.crc32c(data)
        return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)

    with open(path, "wb") as f:
        for r in records:
            length = struct.pack("<Q", len(r))
            f.write(length + masked(length) + r + masked(r))


def section_storage(quick: bool) -> list[Row]:
    import grain
    import pyarrow as pa
    import pyarrow.parquet as pq

    from chute.sources import (
        ArrayRecordDataSource,
        JsonlDataSource,
        ParquetDataSource,
        RecordFileDataSource,
        TFRecordDataSource,
    )

    jsonl, ar = bench_torch.corpus()
    lines = jsonl.read_bytes().splitlines()
    work = Path(tempfile.mkdtemp(prefix="chute-suite-storage-"))
    crec, tfr, parquet = work / "c.crec", work / "c.tfrecord", work / "c.parquet"
    with contextlib.redirect_stdout(io.StringIO()):
        chute.cli.main(["convert", str(jsonl), str(crec), "--overwrite", "--no-progress"])
    _write_tfrecord(tfr, lines)
    parsed = [json.loads(x) for x in lines]
    pq.write_table(pa.Table.from_pylist(parsed), parquet, row_group_size=4096)
    rng = random.Random(0)
    reads = 20_000 if quick else 100_000
    idx = [rng.randrange(len(lines)) for _ in range(reads)]
    sources: dict[str, tuple[Any, int]] = {
        ".crec": (RecordFileDataSource(crec), reads),
        "ArrayRecord": (ArrayRecordDataSource(str(ar)), reads),
        "grain ArrayRecord": (grain.sources.ArrayRecordDataSource(str(ar)), reads // 20),
        "JSONL": (JsonlDataSource(jsonl), reads),
        "Parquet": (ParquetDataSource(parquet), reads // 20),
        "TFRecord": (TFRecordDataSource(tfr), reads),
    }

    def loop(src: Any, n: int) -> Callable[[], int]:
        def run() -> int:
            get = src.__getitem__
            for i in idx[:n]:
                get(i)
            return n

        return run

    for src, n in sources.values():  # open, index, warm the page cache
        loop(src, min(n, 2000))()
    r = rates({k: loop(*v) for k, v in sources.items()}, repeats=2 if quick else 3)
    rows = []
    for name in (".crec", "ArrayRecord", "JSONL", "Parquet", "TFRecord"):
        values: dict[str, float | None] = {"chute": r[name], "grain": None, "torch": None}
        if name == "ArrayRecord":
            values["grain"] = r["grain ArrayRecord"]
        rows.append(Row(f"random reads: {name} ({len(lines):,} records)", "rec/s", values))
    return rows


def _train(it: Any, steps: int, step_s: float) -> float:
    """Seed 003's `train`: % of the time spent waiting for data."""
    try:
        next(it)  # the first batch is not part of the loop (seed 003 times it apart)
        start = time.perf_counter()
        for _ in range(steps):
            next(it)
            time.sleep(step_s)
        total = time.perf_counter() - start
        return 100 * (total - steps * step_s) / total
    finally:
        bench_image.close(it)


def section_waiting(quick: bool) -> list[Row]:
    paths = bench_image.make_images(192 if quick else 320)
    probe, _ = bench_image.images_per_s("chute", paths, 0, 1.0)
    step_s = 2 * bench_image.BATCH / probe  # training twice as slow as loading
    steps = 10 if quick else 30

    def chute_or_grain(lib: str) -> Any:
        g = bench_image.lib_module(lib)
        ds = bench_image.dataset(lib, paths, 0)
        return iter(g.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=3))

    values: dict[str, float | None] = {
        "chute": _train(chute_or_grain("chute"), steps, step_s),
        "grain": _train(chute_or_grain("grain"), steps, step_s),
        "torch": _train(bench_image.torch_loader(paths, 1, prefetch_factor=3), steps, step_s),
    }
    return [
        Row(
            f"waiting for data: image, prefetch 3, step {step_s * 1e3:.0f} ms",
            "% wait",
            values,
            higher_is_better=False,
            note="ratio of small percentages: noisy",
        )
    ]


def section_checkpoint(quick: bool) -> list[Row]:
    cfg = bench_checkpoint.configure(
        argparse.Namespace(quick=quick, lib=["chute", "grain", "torch"], rounds=1)
    )
    res = bench_checkpoint.measure(cfg)
    bad = [lib for lib, r in res.items() if r.mismatches]
    if bad:
        raise AssertionError(f"checkpoint: restored batches differ for {bad}")
    return [
        Row(
            "checkpoint: get_state(), packed text, 2 workers (median)",
            "us",
            {lib: statistics.median(r.get_state_s) * 1e6 for lib, r in res.items()},
            higher_is_better=False,
            note="torch: padded, StatefulDataLoader.state_dict()",
        ),
        Row(
            "checkpoint: restore to first batch, packed text, 2 workers",
            "s",
            {lib: statistics.median(r.restore_s) for lib, r in res.items()},
            higher_is_better=False,
            note="fresh iterator + set_state + next, worker start-up included",
        ),
    ]


def section_peers(quick: bool, rounds: int = 3) -> list[Row]:
    """The rows of SPDL, torchdata.nodes, MosaicML Streaming and LitData beside chute,
    measured in `.venv-peers` (see `peers.py`); none, with a message, without it."""
    import peers  # here, not above: the forkserver imports this script's imports

    exe = peers.python()
    if exe is None:
        print(f"# peers skipped: {peers.missing_message()}", file=sys.stderr, flush=True)
        return []
    bench_torch.corpus()  # the corpus and the images, made with this Python's packages
    bench_image.make_images(peers.IMAGES_QUICK if quick else peers.IMAGES_FULL)
    print(f"# peers' Python: {exe}: {peers.versions(exe)}", flush=True)
    results = peers.collect(
        exe,
        quick,
        rounds=rounds,
        seconds=1.5 if quick else 4.0,
        log=lambda line: print(line, flush=True),
    )
    return peer_rows(results)


def peer_rows(results: list[Any]) -> list[Row]:
    """Rows of `peers.Result`s: medians, the widest spread, the load, and a note naming
    each peer ahead of chute (beyond the noise: its slowest round beat chute's fastest)."""
    rows = []
    for res in results:
        spec = res.spec
        values: dict[str, float | None] = {lib: res.median(lib) for lib in PEER_LIBS}
        notes = []
        for lib in PEER_LIBS[1:]:
            if lib in res.errors:
                last = res.errors[lib].rsplit("|", 1)[-1].strip()
                notes.append(f"{lib}: failed ({last[:120]})")
            elif lib in res.rounds:
                c, o = res.median("chute"), res.median(lib)
                ahead, n = res.rounds_ahead(lib)
                if c and o and o > c:
                    verdict = "WINS beyond the noise" if res.beats_chute(lib) else "ahead"
                    notes.append(
                        f"{lib} {verdict}: {o / c:.2f}x chute, faster in {ahead} of {n} rounds"
                    )
        for why in dict.fromkeys(spec.missing.values()):  # one note per reason
            libs = ", ".join(lib for lib, w in spec.missing.items() if w == why)
            notes.append(f"{libs}: - ({why})")
        spreads = {lib: res.spread(lib) for lib in res.rounds}
        widest = max(spreads, key=lambda k: spreads[k] or 0.0) if spreads else None
        rows.append(
            Row(
                spec.title,
                spec.unit,
                values,
                note="; ".join(notes),
                spread=f"{spreads[widest]:.0%} ({widest})" if widest else "-",
                load=f"{res.load_start:.1f} -> {res.load_end:.1f}",
                rounds=res.rounds,
            )
        )
    return rows


SECTION_FUNCS: dict[str, Callable[[bool], list[Row]]] = {
    "overhead": section_overhead,
    "text": section_text,
    "image": section_image,
    "transfer": section_transfer,
    "storage": section_storage,
    "waiting": section_waiting,
    "checkpoint": section_checkpoint,
}


# -- output --------------------------------------------------------------------------------


def fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit in ("s", "GB/s"):
        return f"{x:.2f}"
    if unit == "% wait":
        return f"{x:.1f}%"
    return f"{x:,.0f}"


def ratio_text(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def print_peer_table(rows: list[Row]) -> str:
    body = [
        [
            r.workload,
            r.unit,
            *(fmt(r.values.get(lib), r.unit) for lib in PEER_LIBS),
            *(ratio_text(r.ratio(lib)) for lib in PEER_LIBS[1:]),
            r.spread,
            r.load,
            r.note,
        ]
        for r in rows
    ]
    headers = [
        "workload",
        "unit",
        *PEER_LIBS,
        *(f"chute vs {lib}" for lib in PEER_LIBS[1:]),
        "spread",
        "load 1m",
        "note",
    ]
    return table(headers, body)


def print_table(rows: list[Row]) -> str:
    body = [
        [
            r.workload,
            r.unit,
            *(fmt(r.values.get(lib), r.unit) for lib in LIBS),
            ratio_text(r.ratio("grain")),
            ratio_text(r.ratio("torch")),
            r.note,
        ]
        for r in rows
    ]
    headers = ["workload", "unit", *LIBS, "chute vs grain", "chute vs torch", "note"]
    return table(headers, body)


def plot(rows: list[Row], path: Path, title: str) -> bool:
    """The ratios to Grain and torch as bars in `path`; False when no row has one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.ratio("grain") or r.ratio("torch")]
    if not shown:
        return False
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(shown) + 1.8))
    ys = range(len(shown))
    for k, (other, color) in enumerate((("grain", "#4c72b0"), ("torch", "#dd8452"))):
        vals = [r.ratio(other) or 0.0 for r in shown]
        ax.barh(
            [y + (k - 0.5) * 0.38 for y in ys], vals, 0.38, label=f"chute vs {other}", color=color
        )
        for y, v in zip(ys, vals):
            if v:
                ax.text(v * 1.04, y + (k - 0.5) * 0.38, f"{v:.2f}x", va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    top = max((r.ratio(o) or 1.0) for r in shown for o in ("grain", "torch"))
    low = min((r.ratio(o) or 1.0) for r in shown for o in ("grain", "torch"))
    ax.set_xlim(min(0.5, low / 1.5), max(2.0, top * 2.5))
    ax.set_yticks(list(ys), [r.workload for r in shown], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("chute's advantage (x, log scale; > 1: chute better)")
    fig.suptitle("\n".join(textwrap.wrap(title, 120)), fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds: ~3 min")
    p.add_argument(
        "--only",
        action="append",
        choices=(*SECTIONS, PEER_SECTION),
        help="run only these sections",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="add the rows of SPDL, torchdata.nodes, Streaming and LitData (.venv-peers)",
    )
    p.add_argument(
        "--peer-rounds", type=int, help="rounds of each peer row (default 5; 3 with --quick)"
    )
    p.add_argument("--out", type=Path, default=OUT, help="where suite.json/.png go")
    args = p.parse_args()
    if args.peer_rounds is None:
        args.peer_rounds = 3 if args.quick else 5
    if args.peer_rounds < 1:
        p.error(f"--peer-rounds {args.peer_rounds}: needs at least 1 round (3 for a median)")
    warnings.filterwarnings("ignore")
    sections = args.only or list(SECTIONS)
    if args.peers and PEER_SECTION not in sections:
        sections.append(PEER_SECTION)
    args.out.mkdir(parents=True, exist_ok=True)
    header = f"# chute benchmark suite{' (--quick)' if args.quick else ''}: {machine()}"
    print(header, flush=True)
    rows: list[Row] = []
    peer_rows: list[Row] = []
    seconds: dict[str, float] = {}
    errors: dict[str, str] = {}
    for name in sections:
        t0 = time.perf_counter()
        print(f"# running {name} ...", file=sys.stderr, flush=True)
        try:
            if name == PEER_SECTION:
                peer_rows += section_peers(args.quick, args.peer_rounds)
                if not peer_rows:
                    errors[name] = "no peer rows: .venv-peers is missing (see above)"
            else:
                rows += SECTION_FUNCS[name](args.quick)
        except Exception:  # one broken section must not lose the others' figures
            errors[name] = traceback.format_exc()
            print(f"# {name} failed:\n{errors[name]}", file=sys.stderr, flush=True)
        seconds[name] = time.perf_counter() - t0
    if rows:
        print()
        print(print_table(rows))
    if peer_rows:
        print("\n# chute beside SPDL, torchdata.nodes, MosaicML Streaming and LitData (median")
        print("# of the rounds; chute vs X above 1: chute is faster):")
        print(print_peer_table(peer_rows))
    took = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
    print(f"\n# took {sum(seconds.values()):.0f} s ({took}); shared machine: figures are noisy")
    result = {
        "machine": machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "quick": args.quick,
        "when": time.time(),
        "seconds": seconds,
        "errors": errors,
        "rows": [
            {**asdict(r), "chute_vs_grain": r.ratio("grain"), "chute_vs_torch": r.ratio("torch")}
            for r in rows
        ],
        "peer_rows": [
            {**asdict(r), "chute_vs": {lib: r.ratio(lib) for lib in PEER_LIBS[1:]}}
            for r in peer_rows
        ],
    }
    (args.out / "suite.json").write_text(json.dumps(result, indent=1))
    wrote = [args.out / "suite.json"]
    if rows and plot(rows, args.out / "suite.png", header.lstrip("# ")):
        wrote.append(args.out / "suite.png")
    print(f"# wrote {' and '.join(map(str, wrote))}")
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
