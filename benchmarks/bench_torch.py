"""Workloads written once for each of chute, Grain 0.2.18 and the PyTorch DataLoader.

`run_all.py` times these side by side; this module only builds the iterators. Each
library runs the same per-element work, written the way its users would write it:

- `overhead`: range(n), shuffle, a cheap map (x * 2), batch 32. chute and Grain: the
  functions of `bench_core.py`; torch: a map-style Dataset, `DataLoader(batch_size=32,
  shuffle=True)`, default collate.
- `text`: seed 003's pipeline on the shared corpus in ArrayRecord (`group_size:1`): parse
  JSON, tokenize (bert-base-uncased with `tokenizers`), shuffle(42), repeat, shard 1 of
  16, trim and pad to 128, batch 512. torch: a Dataset reading the same file with
  array_record's reader, `DistributedSampler(num_replicas=16, rank=1, seed=42)` (torch's
  sharding), epochs one after another.
- `transfer`: each element a 16 MiB float32 array made in a worker process (2 workers);
  the consumer reads one value of each. torch: `DataLoader(batch_size=None, num_workers=2)`.

    .venv/bin/python benchmarks/bench_torch.py      # prints one line per workload
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chute
from _corpus import Tokenize
from _harness import shared_data
from bench_image import close, lib_module

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench_out"
SEQ_LEN = 128
TEXT_BATCH = 512
CORPUS_RECORDS = 120_000


def corpus(n: int = CORPUS_RECORDS) -> tuple[Path, Path]:
    """`bench_out/corpus_N.jsonl` and `.array_record` (one JSON record per record,
    `group_size:1`), made once; never left half-written under the final name."""
    OUT.mkdir(exist_ok=True)
    jsonl, ar = OUT / f"corpus_{n}.jsonl", OUT / f"corpus_{n}.array_record"
    if not jsonl.exists():
        tmp = jsonl.with_suffix(".jsonl.tmp")
        script = shared_data() / "make_corpus.py"
        subprocess.run([sys.executable, str(script), str(tmp), str(n)], check=True)
        tmp.rename(jsonl)
    if not ar.exists():
        from array_record.python.array_record_module import ArrayRecordWriter

        tmp = ar.with_suffix(".array_record.tmp")
        writer = ArrayRecordWriter(str(tmp), "group_size:1")
        with open(jsonl, "rb") as f:
            for line in f:
                writer.write(line.rstrip(b"\n"))
        writer.close()
        tmp.rename(ar)
    return jsonl, ar


# -- overhead ------------------------------------------------------------------------------


class TorchRange:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i * 2


def torch_overhead(n: int) -> int:
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(1)
    count = 0
    for batch in DataLoader(TorchRange(n), batch_size=32, shuffle=True):  # type: ignore[arg-type]
        count += len(batch)
    return count


# -- seed 003's text pipeline --------------------------------------------------------------


def trim_and_pad(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens = element["description"][:SEQ_LEN]
    padded = np.zeros(SEQ_LEN, dtype=np.int32)
    padded[: len(tokens)] = tokens
    return {"description": padded}


def text_dataset(lib: str, path: Path, threads: int) -> Any:
    g = lib_module(lib)
    return (
        g.MapDataset.source(g.sources.ArrayRecordDataSource(str(path)))
        .map(json.loads)
        .map(Tokenize())
        .shuffle(seed=42)
        .repeat(num_epochs=100)[1::16]
        .map(trim_and_pad)
        .to_iter_dataset(g.ReadOptions(num_threads=threads))
        .batch(TEXT_BATCH, drop_remainder=True)
    )


class TorchText:
    """Record i of the ArrayRecord file, parsed, tokenized, trimmed and padded."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._source: Any = None
        self._tokenize = Tokenize()
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        self._len = len(ArrayRecordDataSource(self.path))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if self._source is None:  # opened in the process that reads (workers)
            from array_record.python.array_record_data_source import ArrayRecordDataSource

            self._source = ArrayRecordDataSource(self.path)
        return trim_and_pad(self._tokenize(json.loads(self._source[i])))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_source": None}


def torch_text(path: Path, workers: int) -> Iterator[Any]:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    torch.manual_seed(42)
    ds = TorchText(path)
    sampler = DistributedSampler(ds, num_replicas=16, rank=1, shuffle=True, seed=42)  # type: ignore[arg-type]
    loader = DataLoader(
        ds,  # type: ignore[arg-type]
        batch_size=TEXT_BATCH,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def text_rows(batch: dict[str, Any]) -> int:
    return len(batch["description"])


def text_iter(lib: str, path: Path, parallel: int) -> Iterator[Any]:
    """chute/Grain: `parallel` threads, no worker; torch: `parallel` worker processes."""
    if lib == "torch":
        return torch_text(path, parallel)
    return iter(text_dataset(lib, path, parallel))


# -- large arrays from worker processes -----------------------------------------------------


def big_array(i: int) -> np.ndarray:
    return np.full((4096, 1024), i, dtype=np.float32)  # 16 MiB


class TorchBig:
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> np.ndarray:
        return big_array(i)


def transfer_iter(lib: str, workers: int = 2) -> Iterator[Any]:
    if lib == "torch":
        from torch.utils.data import DataLoader

        return iter(DataLoader(TorchBig(), batch_size=None, num_workers=workers))  # type: ignore[arg-type]
    g = lib_module(lib)
    ds = g.MapDataset.range(1_000_000).map(big_array).to_iter_dataset(g.ReadOptions(num_threads=0))
    opts = (
        chute.MultiprocessingOptions(num_workers=workers)
        if g is chute
        else g.multiprocessing.MultiprocessingOptions(num_workers=workers)
    )
    return iter(ds.mp_prefetch(opts))


def rate_after_first(
    it: Iterator[Any], seconds: float, size: Any = len, touch: Any = None
) -> tuple[float, float]:
    """(items/s after the first element, seconds to the first element) of a fresh
    iterator, for about `seconds`; `size(element)` counts an element's items."""
    t0 = time.perf_counter()
    try:
        first = next(it)
        first_s = time.perf_counter() - t0
        if touch is not None:
            touch(first)
        n, t1 = 0, time.perf_counter()
        while time.perf_counter() - t1 < seconds:
            x = next(it)
            if touch is not None:
                touch(x)
            n += size(x)
        return n / (time.perf_counter() - t1), first_s
    finally:
        close(it)


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    _, ar = corpus()
    for lib in ("chute", "grain", "torch"):
        rows, _ = rate_after_first(text_iter(lib, ar, 0), 2.0, size=text_rows)
        print(f"text, {lib}, 0 workers/threads: {rows:,.0f} rows/s")
    for lib in ("chute", "grain", "torch"):
        nbytes, _ = rate_after_first(
            transfer_iter(lib), 2.0, size=lambda a: a.nbytes, touch=lambda a: float(a[0, 0])
        )
        print(f"transfer 16 MiB arrays, {lib}, 2 workers: {nbytes / 1e9:.2f} GB/s")
    for name, run in (("torch", torch_overhead),):
        t0 = time.perf_counter()
        n = run(50_000)
        print(f"overhead, {name}: {n / (time.perf_counter() - t0):,.0f} elements/s")


if __name__ == "__main__":
    main()
