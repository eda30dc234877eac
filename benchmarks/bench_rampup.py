"""Ramp-up with 2 worker processes: chute beside the PyTorch DataLoader.

For each pipeline and contender, a fresh Python process (libraries imported before the
clock starts) builds the pipeline, creates the iterator and takes batches:

- first batch, s: from building the pipeline to the first batch (worker start-up
  included; for chute also the start of its forkserver, which a fresh process has not),
  or from `iter()` for "chute, built ahead";
- first 10 rate: rows (or images) per second over the 10 batches after the first;
- steady rate: the same after batch 20, for about `--steady-s` seconds;
- first 10 / steady: how far from its pace a fresh iterator starts (issue 17's target:
  >= 0.8).

Pipelines (the work per element is the same in every library):

- `text padded`: seed 003's pipeline on the shared corpus in ArrayRecord: parse JSON,
  tokenize (bert-base-uncased, `tokenizers`), shuffle(42), repeat, shard 1 of 16, trim and
  pad to 128, batch 512. torch: a map-style Dataset doing the same per element,
  `DistributedSampler(num_replicas=16, rank=1, seed=42)`, `batch_size=512`.
- `text packed`: chute only (the DataLoader has no packing): first-fit packing of the
  trimmed sequences into 30 bins of 128 tokens, then batch 512 (seed 003's cells).
- `image`: JPEG decode with Pillow, random 224 crop and flip, batch 64
  (`bench_image.py`'s work; photographs from scikit-image / matplotlib when installed,
  else synthetic pictures of the same sizes).

Contenders: chute `mp_prefetch(MultiprocessingOptions(num_workers=2))`; "chute, built
ahead": the same pipeline built 1 s before the clock starts at `iter()` (as in a program
that builds its input pipeline, then its model: building the `mp_prefetch` stage starts
the forkserver, whose imports then overlap the rest of the set-up; torch's DataLoader does
nothing until `iter()`, so its rows stand for this case too); "chute, 2nd iterator": the
same timed after one iterator of it has run and closed in the process, so its forkserver
is already running, as for every iterator after a program's first; torch
`DataLoader(num_workers=2)` with `multiprocessing_context="fork"` and with its default
(on Linux with Python 3.11 also fork: the row says which). torch's Dataset never opens the
ArrayRecord file in the parent: array_record's reader starts a pool of threads, and
workers forked from a process holding them crash with SIGSEGV (seen on this machine).

Rounds alternate the contenders; the table gives medians over rounds.

    python benchmarks/bench_rampup.py [--rounds 3] [--steady-s 4] [--only image]
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chute
from _corpus import OUT, Tokenize, corpus_array_record, tokenizer_path
from _harness import compile_chute, machine, table

SEQ_LEN = 128
TEXT_BATCH = 512
IMAGE_BATCH = 64
RECORDS = 120_000
PIPELINES = ("text padded", "text packed", "image")
CONTENDERS = ("chute", "chute, built ahead", "chute, 2nd iterator", "torch fork", "torch default")


# -- the work, module level so that worker processes can unpickle it ------------------------


def trim(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"description": element["description"][:SEQ_LEN]}


def pad(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens = element["description"][:SEQ_LEN]
    out = np.zeros(SEQ_LEN, dtype=np.int32)
    out[: len(tokens)] = tokens
    return {"description": out}


def chute_text(packed: bool, workers: int = 2) -> Any:
    ds = (
        chute.MapDataset.source(
            chute.sources.ArrayRecordDataSource(str(corpus_array_record(RECORDS)))
        )
        .map(json.loads)
        .map(Tokenize(str(tokenizer_path())))
        .shuffle(seed=42)
        .repeat(num_epochs=100)[1::16]
        .map(trim if packed else pad)
    )
    it_ds = ds.to_iter_dataset(chute.ReadOptions(num_threads=0))
    if packed:
        it_ds = chute.experimental.FirstFitPackIterDataset(
            it_ds, length_struct={"description": SEQ_LEN}, num_packing_bins=30
        )
    it_ds = it_ds.batch(TEXT_BATCH, drop_remainder=True)
    return it_ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))


class TorchText:
    """Record i of the ArrayRecord file, parsed, tokenized, trimmed and padded; the reader
    is opened in the process that reads (never in the parent: see the module doc)."""

    def __init__(self, path: str, length: int) -> None:
        self.path = path
        self.length = length
        self.tokenize = Tokenize(str(tokenizer_path()))
        self.source: Any = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if self.source is None:
            from array_record.python.array_record_data_source import ArrayRecordDataSource

            self.source = ArrayRecordDataSource(self.path)
        return pad(self.tokenize(json.loads(self.source[i])))


def torch_text(context: str | None) -> Any:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    torch.manual_seed(42)
    ds = TorchText(str(corpus_array_record(RECORDS)), RECORDS)
    sampler = DistributedSampler(ds, num_replicas=16, rank=1, shuffle=True, seed=42)  # type: ignore[arg-type]
    loader = DataLoader(
        ds,  # type: ignore[arg-type]
        batch_size=TEXT_BATCH,
        sampler=sampler,
        drop_last=True,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
    )

    def forever() -> Any:
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from loader

    return forever()


def images() -> list[str]:
    """bench_image.py's JPEG files; synthetic pictures of the same sizes when neither
    scikit-image nor matplotlib is installed."""
    import bench_image

    try:
        return bench_image.make_images(320)
    except (SystemExit, ImportError):
        return synthetic_images(320)


def synthetic_images(count: int) -> list[str]:
    from PIL import Image

    folder = OUT / "images_synthetic"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for k in range(count):
        path = folder / f"img_{k:05d}.jpg"
        paths.append(str(path))
        if path.exists():
            continue
        short = (256, 320, 400, 480)[k % 4]
        h, w = short, int(short * 1.4)
        y, x = np.mgrid[0:h, 0:w] / short
        waves = [np.sin(x * (3 + k % 5) + c) * np.cos(y * (2 + k % 3) - c) for c in range(3)]
        noise = rng.normal(0, 0.15, (h // 8 + 1, w // 8 + 1, 3)).repeat(8, 0).repeat(8, 1)
        pixels = ((np.stack(waves, -1) + noise[:h, :w] + 1.2) * 100).clip(0, 255)
        buf = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8)).save(buf, format="JPEG", quality=90)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(buf.getvalue())
        tmp.rename(path)
    return paths


def make(pipeline: str, contender: str, paths: list[str]) -> Any:
    """The iterator of `pipeline` for `contender` (building it is part of the timing)."""
    context = {"torch fork": "fork", "torch default": None}.get(contender)
    if contender.startswith("chute"):
        return iter(chute_pipeline(pipeline, paths))
    if pipeline == "image":
        return torch_images(paths, context)
    return torch_text(context)


def chute_pipeline(pipeline: str, paths: list[str]) -> Any:
    import bench_image

    if pipeline == "image":
        return bench_image.dataset("chute", paths, 2)
    return chute_text(packed=pipeline == "text packed")


def torch_images(paths: list[str], context: str | None) -> Any:
    import torch
    from torch.utils.data import DataLoader

    import bench_image

    torch.set_num_threads(1)
    torch.manual_seed(7)
    loader = DataLoader(
        bench_image.TorchImages(paths),  # type: ignore[arg-type]
        batch_size=IMAGE_BATCH,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
    )

    def forever() -> Any:
        while True:
            yield from loader

    return forever()


def rows(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(batch["description"])
    return len(batch)


def child(pipeline: str, contender: str, steady_s: float) -> None:
    """Runs in a fresh process: prints the figures of one run as JSON."""
    warnings.filterwarnings("ignore")
    import torch  # noqa: F401  (imported before the clock, as chute is)

    # `import torch` loads all of torch; `import chute` loads each name on first use. Load
    # them all before the clock too (as `import chute` did before it was lazy), so that
    # the timing is of building and starting, not of importing (the debug layer aside,
    # which a run without it never loads).
    for name in chute.__all__:
        if name not in ("PipelineStats", "StageStats", "stats"):
            getattr(chute, name)

    paths = images() if pipeline == "image" else []
    if pipeline != "image":
        corpus_array_record(RECORDS)
    if contender == "chute, 2nd iterator":
        earlier = make(pipeline, contender, paths)
        next(earlier)
        earlier.close()
    if contender == "chute, built ahead":
        ds = chute_pipeline(pipeline, paths)
        time.sleep(1.0)
        t0 = time.perf_counter()
        it = iter(ds)
    else:
        t0 = time.perf_counter()
        it = make(pipeline, contender, paths)
    stamps = []
    sizes = []
    while len(stamps) < 21 or time.perf_counter() - stamps[20] < steady_s:
        sizes.append(rows(next(it)))
        stamps.append(time.perf_counter())
    close = getattr(it, "close", None)
    if close is not None:
        close()
    first10 = sum(sizes[1:11]) / (stamps[10] - stamps[0])
    steady = sum(sizes[21:]) / (stamps[-1] - stamps[20])
    context = ""
    if contender.startswith("torch"):
        import multiprocessing

        context = multiprocessing.get_start_method()
    print(
        json.dumps(
            {
                "first_s": stamps[0] - t0,
                "first10": first10,
                "steady": steady,
                "context": context,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steady-s", type=float, default=4.0)
    parser.add_argument("--only", action="append", choices=PIPELINES)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.steady_s)
        return
    warnings.filterwarnings("ignore")
    pipelines = args.only or list(PIPELINES)
    corpus_array_record(RECORDS)
    images()
    compiled = compile_chute()
    print(f"# bench_rampup: 2 worker processes, fresh process per run\n# {machine()}")
    print(f"# {compiled}")
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for pipeline in pipelines:
            for contender in CONTENDERS:
                if pipeline == "text packed" and not contender.startswith("chute"):
                    continue
                cmd = [sys.executable, __file__, "--child", pipeline, contender]
                cmd += ["--steady-s", str(args.steady_s)]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if proc.returncode != 0:
                    raise RuntimeError(f"{cmd} failed:\n{proc.stderr[-3000:]}")
                results.setdefault((pipeline, contender), []).append(
                    json.loads(proc.stdout.strip().splitlines()[-1])
                )
    table_rows = []
    for (pipeline, contender), runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("first_s", "first10", "steady")}
        ratio = statistics.median(r["first10"] / r["steady"] for r in runs)
        unit = "img/s" if pipeline == "image" else "rows/s"
        name = contender + (f" ({runs[0]['context']})" if runs[0]["context"] else "")
        table_rows.append(
            [
                pipeline,
                name,
                f"{med['first_s']:.2f}",
                " ".join(f"{r['first_s']:.2f}" for r in runs),
                f"{med['first10']:,.0f} {unit}",
                f"{med['steady']:,.0f} {unit}",
                f"{ratio:.2f}",
            ]
        )
    headers = [
        "pipeline",
        "contender, 2 workers",
        "first batch s",
        "(each round)",
        "first 10 rate",
        "steady rate",
        "first 10 / steady",
    ]
    print(table(headers, table_rows))
    print(f"(medians of {args.rounds} rounds; contenders alternate within each round)")


if __name__ == "__main__":
    main()
