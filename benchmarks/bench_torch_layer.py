"""chute's torch path beside `torch.utils.data.DataLoader` and torchdata's
`StatefulDataLoader`, on seed 003's text pipeline and the image pipeline, 2 workers each.

Workloads (the per-element work of `bench_torch.py` and `bench_image.py`, unchanged):
- text: the shared news corpus in ArrayRecord (`group_size:1`): parse JSON, tokenize
  (bert-base-uncased, `tokenizers`), shuffle(42), shard 1 of 16, trim and pad to 128,
  batches of 512 (drop_remainder).
- image: JPEG files decoded with Pillow, a random 224x224 crop and flip, batches of 64.

Contenders, each yielding batches of torch tensors, with 2 worker processes:
- `chute mp_prefetch + to_tensors`: the chute pipeline with `mp_prefetch(2 workers)`,
  each batch `chute.torch.to_tensors` (no copy: views of the workers' shared memory).
- `chute.torch.IterableDataset`: the adapter in `DataLoader(batch_size=None,
  num_workers=2, persistent_workers=True)`; chute batches in each torch worker
  (`ReadOptions(num_threads=0)`: one element at a time, as torch's workers compute).
- `torch DataLoader`: a map-style Dataset doing the same work in `__getitem__`,
  `DataLoader(batch_size=B, num_workers=2, persistent_workers=True, pin_memory=False)`,
  default collate, prefetch_factor 2 (its default; 4 measured no faster here); the text
  shard is a `DistributedSampler(num_replicas=16, rank=1, seed=42)`.
- `torchdata StatefulDataLoader`: the same Dataset and settings in torchdata's loader.

torch's workers start by forkserver (`multiprocessing_context`), as chute's do: forked
from this process, which has run the other contenders and holds ArrayRecord readers, a
worker opening a reader of its own can crash. pin_memory is off: this machine has no CUDA (pinning would be a no-op that warns). Rows
(text) or images per second after the first batch, contenders interleaved round by round,
the median over rounds; the machine is shared, so compare ratios within one run.

    .venv/bin/python benchmarks/bench_torch_layer.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chute
import chute.torch as ct
from _corpus import Tokenize, corpus_array_record
from _harness import machine, table
from bench_image import BATCH as IMAGE_BATCH
from bench_image import TorchImages, load_and_augment, make_images
from bench_torch import TEXT_BATCH, TorchText, rate_after_first, trim_and_pad

RESULTS = Path(__file__).resolve().parent / "results" / "2026-11-23"
WORKERS = 2
# torch's workers start by forkserver: forked from this process, which has opened
# ArrayRecord files, a worker that starts a thread and then opens an ArrayRecord reader
# crashes with SIGSEGV (array_record's C++ library does not survive fork).
CONTEXT = "forkserver"


# -- text ------------------------------------------------------------------------------------


def chute_text_map(path: Path) -> chute.MapDataset[Any]:
    return (
        chute.MapDataset.source(chute.sources.ArrayRecordDataSource(str(path)))
        .map(json.loads)
        .map(Tokenize())
        .shuffle(seed=42)
    )


def text_chute_mp(path: Path) -> Iterator[Any]:
    ds = (
        chute_text_map(path)
        .repeat()[1::16]
        .map(trim_and_pad)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .batch(TEXT_BATCH, drop_remainder=True)
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=WORKERS))
    )
    return _tensors(iter(ds))


def text_adapter(path: Path) -> Iterator[Any]:
    ds = ct.IterableDataset(
        chute_text_map(path).map(trim_and_pad),
        batch_size=TEXT_BATCH,
        drop_remainder=True,
        shard_options=chute.sharding.ShardOptions(1, 16),
        read_options=chute.ReadOptions(num_threads=0),
    )
    return _torch_loader(ds, batch_size=None)


def text_torch(path: Path, loader_cls: Any = None) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    torch.manual_seed(42)
    ds = TorchText(path)
    sampler = DistributedSampler(ds, num_replicas=16, rank=1, shuffle=True, seed=42)  # type: ignore[arg-type]
    loader = (loader_cls or DataLoader)(
        ds,
        batch_size=TEXT_BATCH,
        sampler=sampler,
        drop_last=True,
        num_workers=WORKERS,
        persistent_workers=True,
        pin_memory=False,
        multiprocessing_context=CONTEXT,
    )
    return _epochs(loader, sampler)


# -- image ----------------------------------------------------------------------------------


def image_chute_mp(paths: list[str]) -> Iterator[Any]:
    ds = (
        chute.MapDataset.source(paths)
        .shuffle(seed=7)
        .repeat()
        .random_map(load_and_augment, seed=3)
        .batch(IMAGE_BATCH)
        .to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=WORKERS))
    )
    return _tensors(iter(ds))


def image_adapter(paths: list[str]) -> Iterator[Any]:
    ds = ct.IterableDataset(
        chute.MapDataset.source(paths).shuffle(seed=7).random_map(load_and_augment, seed=3),
        batch_size=IMAGE_BATCH,
        read_options=chute.ReadOptions(num_threads=0),
    )
    return _torch_loader(ds, batch_size=None)


def image_torch(paths: list[str], loader_cls: Any = None) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(7)
    loader = (loader_cls or DataLoader)(
        TorchImages(paths),
        batch_size=IMAGE_BATCH,
        shuffle=True,
        num_workers=WORKERS,
        persistent_workers=True,
        pin_memory=False,
        multiprocessing_context=CONTEXT,
    )
    return _epochs(loader, None)


# -- plumbing -------------------------------------------------------------------------------


class _tensors:
    """A chute iterator's batches as tensors (`chute.torch.to_tensors`); closes it."""

    def __init__(self, it: Any) -> None:
        self._it = it

    def __iter__(self) -> _tensors:
        return self

    def __next__(self) -> Any:
        return ct.to_tensors(next(self._it))

    def close(self) -> None:
        self._it.close()


def _torch_loader(ds: Any, batch_size: int | None) -> Iterator[Any]:
    from torch.utils.data import DataLoader

    loader = DataLoader(
        ds,
        batch_size=batch_size,
        num_workers=WORKERS,
        persistent_workers=True,
        multiprocessing_context=CONTEXT,
    )
    while True:  # persistent workers: each pass is the adapter's next epoch
        yield from loader


def _epochs(loader: Any, sampler: Any) -> Iterator[Any]:
    for epoch in itertools.count():
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader


def _stateful() -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader


def measure(quick: bool) -> tuple[dict[str, dict[str, list[float]]], dict[str, str]]:
    import torch

    torch.set_num_threads(1)  # as in the workers: one thread per process on 2 cores
    text_path = corpus_array_record(120_000)
    paths = make_images(192 if quick else 320)
    workloads: dict[str, tuple[dict[str, Callable[[], Iterator[Any]]], Callable[[Any], int]]] = {
        "text (rows/s)": (
            {
                "chute mp_prefetch + to_tensors": lambda: text_chute_mp(text_path),
                "chute.torch.IterableDataset": lambda: text_adapter(text_path),
                "torch DataLoader": lambda: text_torch(text_path),
                "torchdata StatefulDataLoader": lambda: text_torch(text_path, _stateful()),
            },
            lambda b: len(b["description"]),
        ),
        "image (images/s)": (
            {
                "chute mp_prefetch + to_tensors": lambda: image_chute_mp(paths),
                "chute.torch.IterableDataset": lambda: image_adapter(paths),
                "torch DataLoader": lambda: image_torch(paths),
                "torchdata StatefulDataLoader": lambda: image_torch(paths, _stateful()),
            },
            len,
        ),
    }
    seconds, rounds = (1.5, 2) if quick else (5.0, 3)
    out: dict[str, dict[str, list[float]]] = {w: {} for w in workloads}
    for _ in range(rounds):
        for workload, (runs, size) in workloads.items():
            for name, make in runs.items():
                rate, _ = rate_after_first(make(), seconds, size=size)
                out[workload].setdefault(name, []).append(rate)
    return out, {"rounds": str(rounds), "seconds": str(seconds)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    res, info = measure(args.quick)
    lines = [
        "# bench_torch_layer: chute's torch path beside torch's DataLoader and torchdata's "
        "StatefulDataLoader, 2 workers",
        f"# {machine()}",
        f"# {info['rounds']} rounds of ~{info['seconds']} s per contender, interleaved; "
        "medians over rounds. The machine was shared with other engineers' test runs: "
        "compare ratios within this run.",
    ]
    for workload, r in res.items():
        medians = {name: statistics.median(v) for name, v in r.items()}
        base = medians["torch DataLoader"]
        rows = [[name, f"{m:,.0f}", f"{m / base:.2f}x"] for name, m in medians.items()]
        lines += ["", table([workload, "median", "/torch DataLoader"], rows)]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_torch_layer.txt").write_text(text)


if __name__ == "__main__":
    main()
