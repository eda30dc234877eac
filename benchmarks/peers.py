"""chute beside four more loaders, each written as its own docs show, on the suite's work.

The peers: SPDL 0.8.0 (`spdl.pipeline.PipelineBuilder`), torchdata 0.11.0's
`torchdata.nodes`, MosaicML Streaming 0.13.0 and LitData 0.2.76. They pull their own torch,
so they live in a virtualenv of their own, `.venv-peers` at the checkout's root, or
anywhere else named by the environment variable CHUTE_PEERS_VENV:

    python3 -m venv .venv-peers
    .venv-peers/bin/pip install -e . tokenizers pillow array-record psutil \\
        torch==2.14.1 torchvision==0.29.1 spdl==0.8.0 torchdata==0.11.0 \\
        mosaicml-streaming==0.13.0 litdata==0.2.76

(verified on a CPU-only machine, at `CHUTE_PEERS_VENV=/work/venv-peers`, on 2026-12-07.)
Streaming needs torchvision at import (`streaming/__init__.py` imports `streaming.vision`,
which imports `torchvision.datasets`); LitData, SPDL and torchdata.nodes do not. The pair
is PyPI's own torch and torchvision, the builds made for each other: they carry CUDA
libraries (about 5.5 GB installed) and run on a machine without a GPU. A CPU-only torch
(`+cpu`, from PyTorch's own index) beside PyPI's torchvision does not: torchvision's
`_C.so` links `libtorch_cuda.so`, which a `+cpu` torch lacks, so `import torchvision` fails
with `operator torchvision::nms does not exist`. PyTorch's CPU index would give a smaller
matching pair (`+cpu` of both); it was not reachable where this was verified, so that
variant is untested. `run_all.py --peers` (or `--only peers`) drives the rows from the suite's own
Python; every measurement runs here, in a fresh `.venv-peers` process, chute's included,
so chute and the peers meet with the same packages, the same process kind and the same
rounds. The rows, each library on the same per-element work as the rest of the suite:

- `overhead`: range(n), shuffle, x * 2, batch 32 in the consumer's process (chute:
  `bench_core.chute_dataset`; SPDL: source -> aggregate(32) -> pipe(double the batch) ->
  sink, one thread; torchdata.nodes: IterableWrapper -> Batcher(32) -> Mapper(double the
  batch) -> Loader: each peer's faster documented form, see VARIANTS); elements/s of a
  whole pass (`OVERHEAD_N` elements, fewer for SPDL, whose pass is slow), the library
  imported before the clock starts.
- `text, 0 workers` / `text, 2 workers`: seed 003's pipeline on the shared corpus
  (ArrayRecord, `group_size:1`): parse JSON, tokenize (bert-base-uncased), trim and pad
  to 128, shuffle (seed 42), repeat, shard 1 of 16, batch 512; rows/s. chute:
  `bench_torch.text_dataset` (0 threads), with `mp_prefetch(2 workers)` for 2. The peers
  read the same records from an endless stream of `DistributedSampler(num_replicas=16,
  rank=1, seed=42)` epochs, through chute's public ArrayRecord reader (the same reader
  as chute's pipeline, so the row compares loaders; array_record's own reader takes
  ~1 ms a record here, more than the rest of the work), a whole batch of indices per
  task (`text_batch`, torchdata's map-and-collate): torchdata.nodes: IterableWrapper ->
  Batcher(512) -> ParallelMapper(map-and-collate, 2 workers, method="process",
  in_order=True) -> Prefetcher(4) -> Loader (0 workers: Mapper); SPDL: add_source ->
  aggregate(512) -> .to(ProcessPoolExecutorConfig(2)) -> pipe(map-and-collate) ->
  .to(MAIN_PROCESS) -> add_sink(3) (0 workers: the same on its thread pool, concurrency 1).
- `image, 2 processes` / `image, 2 threads`: `bench_image`'s JPEG decode (Pillow),
  random 224 crop and flip, batch 64; images/s. chute: `bench_image.dataset` with
  `mp_prefetch(2 workers)` (its default ReadOptions inside each), or the same pipeline
  with `ReadOptions(num_threads=2)`; the peers batch 64 (index, path) items first and
  decode, augment and stack a batch per task: torchdata.nodes ParallelMapper(num_workers=2,
  method="process" or "thread"); SPDL an MP region of 2 processes, or MT with
  concurrency 2 on `build(num_threads=2)`.
- `stream, 2 workers`: the corpus converted once to each library's own format and read
  back shuffled with 2 worker processes, each record parsed, tokenized, trimmed and
  padded to 128, batch 512; rows/s. chute: `chute.records.RecordWriter` (what `chute
  convert` writes), `RecordFileDataSource` -> shuffle -> repeat -> maps -> batch ->
  `mp_prefetch(2)` (`examples/demo.py`'s pipeline); Streaming: `MDSWriter`, then a
  `StreamingDataset(local=..., shuffle=True)` subclass whose `__getitem__` does the work,
  in a torch `DataLoader(num_workers=2, persistent_workers=True)`; LitData:
  `litdata.optimize`, then `StreamingDataset(transform=...)` in a
  `StreamingDataLoader(num_workers=2, persistent_workers=True)`.

Streaming and LitData read their own formats only: they are in the `stream` row and `-`
elsewhere. SPDL and torchdata.nodes read no converted format of their own: `-` there.

Every figure is the median of `rounds` rounds; a warm-up round (short runs of everyone)
comes first; within a round the contenders alternate, the order turning by one each round,
each in a fresh process timed from its first batch for `seconds`. The 1-minute load
average is read at each row's start and end. A peer "wins beyond the noise" when its
slowest round beats chute's fastest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.random  # numpy 2 imports it on first use: imported up front, see below
import PIL.Image  # noqa: F401  (imported up front, as numpy.random)
import tokenizers  # noqa: F401  (imported up front, as numpy.random)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core
import bench_image
import bench_torch
import chute
from _corpus import Tokenize

# The functions below run on peers' threads and in their forked worker processes: every
# module they need is imported here, up front, since a fork taken while another thread
# holds a module's import lock leaves the child waiting on that lock for ever.

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench_out"
PEERS_OUT = OUT / "peers"
VENV = Path(os.environ.get("CHUTE_PEERS_VENV", REPO / ".venv-peers"))  # where they live
PEERS = ("spdl", "torchdata.nodes", "mosaic", "litdata")
PEER_PACKAGES = {
    "spdl": "spdl==0.8.0",
    "torchdata.nodes": "torchdata==0.11.0",
    "mosaic": "mosaicml-streaming==0.13.0",
    "litdata": "litdata==0.2.76",
}
INSTALL = (
    "python3 -m venv .venv-peers && .venv-peers/bin/pip install -e . tokenizers pillow "
    "array-record psutil torch==2.14.1 torchvision==0.29.1 "
    + " ".join(PEER_PACKAGES.values())
    + " (or a virtualenv elsewhere, named by CHUTE_PEERS_VENV)"
)
CORPUS = 120_000  # bench_torch.CORPUS_RECORDS
IMAGES_FULL, IMAGES_QUICK = 320, 192  # bench_image's counts
TEXT_BATCH, IMAGE_BATCH = 512, 64
# Elements of one overhead pass: 0.5-3 s each on a 2-core machine (SPDL hands each
# element through its asyncio stages at ~0.2-0.4 ms); a quarter with --quick.
OVERHEAD_N = {"chute": 2_000_000, "torchdata.nodes": 2_000_000, "spdl": 10_000}
OVERHEAD_N_BATCHED = {"spdl": 40_000}  # SPDL's "batched" variant: one task per 32
SHARD_BYTES = 4 << 20  # MDS shards and LitData chunks: 7 of the 25 MB corpus, for 2 workers


@dataclass
class Spec:
    key: str
    title: str
    unit: str
    contenders: tuple[str, ...]
    missing: dict[str, str] = field(default_factory=dict)  # peer -> why it has no figure


_NOT_A_READER = "no converted format of its own"
_READER_ONLY = "readers of their own formats: stream row"
SPECS = (
    Spec(
        "overhead",
        "peers: overhead, range/shuffle/x*2/batch 32",
        "elem/s",
        ("chute", "spdl", "torchdata.nodes"),
        {"mosaic": _READER_ONLY, "litdata": _READER_ONLY},
    ),
    Spec(
        "text0",
        "peers: seed 003 text, batch 512, 0 workers",
        "rows/s",
        ("chute", "spdl", "torchdata.nodes"),
        {"mosaic": _READER_ONLY, "litdata": _READER_ONLY},
    ),
    Spec(
        "text2",
        "peers: seed 003 text, batch 512, 2 workers",
        "rows/s",
        ("chute", "spdl", "torchdata.nodes"),
        {"mosaic": _READER_ONLY, "litdata": _READER_ONLY},
    ),
    Spec(
        "image_proc",
        "peers: image decode+crop+flip, batch 64, 2 processes",
        "img/s",
        ("chute", "spdl", "torchdata.nodes"),
        {"mosaic": _READER_ONLY, "litdata": _READER_ONLY},
    ),
    Spec(
        "image_thread",
        "peers: image decode+crop+flip, batch 64, 2 threads",
        "img/s",
        ("chute", "spdl", "torchdata.nodes"),
        {"mosaic": _READER_ONLY, "litdata": _READER_ONLY},
    ),
    Spec(
        "stream",
        "peers: stream converted corpus, text work, batch 512, 2 workers",
        "rows/s",
        ("chute", "mosaic", "litdata"),
        {"spdl": _NOT_A_READER, "torchdata.nodes": _NOT_A_READER},
    ),
)


def python() -> Path | None:
    """`.venv-peers`'s Python when it holds all four peers and chute, else None."""
    exe = VENV / "bin" / "python"
    if not exe.exists():
        return None
    probe = "import chute, spdl.pipeline, torchdata.nodes, streaming, litdata, tokenizers"
    ok = subprocess.run([str(exe), "-c", probe], capture_output=True, timeout=300)
    return exe if ok.returncode == 0 else None


def missing_message() -> str:
    return (
        f"the peer rows need a virtualenv at {VENV} holding chute and SPDL, torchdata, "
        f"MosaicML Streaming and LitData; from {REPO}: {INSTALL}"
    )


# -- the shared work (runs in .venv-peers) ---------------------------------------------------

_SOURCES: dict[str, Any] = {}


def text_row(path: str, i: int) -> dict[str, Any]:
    """Record i of the ArrayRecord corpus, parsed, tokenized, trimmed and padded to 128
    (`bench_torch.TorchText`'s work), the file opened once per process."""
    source = _SOURCES.get(path)
    if source is None:
        source = _SOURCES[path] = chute.sources.ArrayRecordDataSource(path)
    return parse_tokenize_pad(source[i])


def parse_tokenize_pad(record: bytes | str) -> dict[str, Any]:
    tokenize = _SOURCES.get("tokenize")
    if tokenize is None:
        tokenize = _SOURCES["tokenize"] = Tokenize()
    return bench_torch.trim_and_pad(tokenize(json.loads(record)))


def image_at(item: tuple[int, str]) -> Any:
    """`bench_image`'s work on (index, path): decode, crop and flip keyed by the index."""
    i, path = item
    return bench_image.augment(bench_image.decode(path), np.random.default_rng([3, i]))


def stack_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"description": np.stack([r["description"] for r in rows])}


def stack_images(images: list[Any]) -> Any:
    return np.stack(images)


def double(x: int) -> int:
    return x * 2


def text_indices(n: int) -> Iterator[int]:
    """Endless epochs of `DistributedSampler(num_replicas=16, rank=1, seed=42)` (made
    here, on the caller's thread: the generator runs on a peer's)."""
    from torch.utils.data import DistributedSampler

    sampler: Any = DistributedSampler(
        range(n),  # type: ignore[arg-type]
        num_replicas=16,
        rank=1,
        shuffle=True,
        seed=42,
    )
    return _epochs(sampler)


def _epochs(sampler: Any) -> Iterator[int]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from sampler
        epoch += 1


def image_items(paths: list[str]) -> Iterator[tuple[int, str]]:
    """Endless epochs of the image files, each epoch in a new shuffled order."""
    epoch = 0
    while True:
        for i in np.random.default_rng([7, epoch]).permutation(len(paths)).tolist():
            yield i, paths[i]
        epoch += 1


def text_batch(path: str, indices: list[int]) -> dict[str, Any]:
    """torchdata's `MapAndCollate` for the text rows: a whole batch of indices read, worked
    and stacked in one task (the migration guide's map-and-collate)."""
    return stack_rows([text_row(path, i) for i in indices])


def image_batch(items: list[tuple[int, str]]) -> Any:
    return stack_images([image_at(item) for item in items])


def double_batch(xs: list[int]) -> list[int]:
    return [x * 2 for x in xs]


# Each peer's documented ways of running a row, measured by `peers.py variants` (results:
# benchmarks/results/2026-12-07/peers_variants_*.txt); BEST holds the fastest, which the
# table uses. The docs each variant follows:
#
# torchdata.nodes, "Migrating to torchdata.nodes from torch.utils.data"
#   (https://pytorch.org/data/0.11/migrate_to_nodes_from_utils.html): sampler -> Batcher
#   -> ParallelMapper(MapAndCollate, num_workers, method="process" (or "thread"),
#   in_order=True) -> Prefetcher(prefetch_factor=num_workers * 2) -> Loader. Variants:
#   method process / thread, in_order True / False ("batch-process", "batch-thread",
#   "...-unordered"); "element-process" is the old per-record ParallelMapper, kept to show
#   what the guide avoids.
# SPDL, "Execution Models: MT, MTP, and MP"
#   (https://facebookresearch.github.io/spdl/0.8.0/getting_started/execution_models.html)
#   and the FAQ "What if a function does not release GIL?"
#   (https://facebookresearch.github.io/spdl/0.8.0/faq.html): "mt" = source -> aggregate
#   -> pipe(map-and-collate, concurrency=N) on the thread pool (build(num_threads=N));
#   "mp" = source -> aggregate -> .to(ProcessPoolExecutorConfig(max_workers=N)) ->
#   pipe(map-and-collate) -> .to(MAIN_PROCESS), the region API the page gives for a
#   GIL-holding stage (whole batches cross the boundary, not elements); "element-mp" is the
#   old per-record pipe(executor=ProcessPoolExecutor), the FAQ's per-stage executor.
#   Subinterpreters need Python 3.14 and no NumPy in the region: not applicable here.
VARIANTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("overhead", "spdl"): ("element", "batched"),
    ("overhead", "torchdata.nodes"): ("element", "batched"),
    ("text0", "spdl"): ("mt",),
    ("text0", "torchdata.nodes"): ("batch-inline",),
    ("text2", "spdl"): ("mp", "mt", "element-mp"),
    ("text2", "torchdata.nodes"): (
        "batch-process",
        "batch-process-unordered",
        "batch-thread",
        "batch-thread-unordered",
        "element-process",
    ),
    ("image_proc", "spdl"): ("mp",),
    ("image_proc", "torchdata.nodes"): ("batch-process", "batch-process-unordered"),
    ("image_thread", "spdl"): ("mt",),
    ("image_thread", "torchdata.nodes"): ("batch-thread", "batch-thread-unordered"),
}
BEST: dict[tuple[str, str], str] = {k: v[0] for k, v in VARIANTS.items()} | {
    ("overhead", "spdl"): "batched",  # 3,346 vs 2,288 elem/s (peers_variants_quick.txt)
    ("overhead", "torchdata.nodes"): "batched",  # 1,029,627 vs 598,837 elem/s
}


def spdl_iter(pipeline: Any) -> Iterator[Any]:
    with pipeline.auto_stop():
        yield from pipeline.get_iterator()


def spdl_batched(
    source: Any, map_and_collate: Callable[[Any], Any], batch: int, workers: int, variant: str
) -> Iterator[Any]:
    """SPDL's MT or MP execution model (see VARIANTS) on whole batches."""
    from spdl.pipeline import PipelineBuilder
    from spdl.pipeline.defs import MAIN_PROCESS, ProcessPoolExecutorConfig

    builder = PipelineBuilder().add_source(source).aggregate(batch, drop_last=True)
    if variant == "mp":
        builder = (
            builder.to(ProcessPoolExecutorConfig(max_workers=workers))
            .pipe(map_and_collate)
            .to(MAIN_PROCESS)
        )
        threads = workers  # the pipeline's own thread pool, for the region's dispatch
    elif variant == "mt":
        builder = builder.pipe(map_and_collate, concurrency=workers)
        threads = workers
    else:
        raise ValueError(f"no SPDL variant {variant!r}; variants: mp, mt")
    return spdl_iter(builder.add_sink(3).build(num_threads=threads))


def spdl_pipeline(
    source: Any,
    op: Callable[[Any], Any],
    batch: int,
    collate: Callable[[Any], Any] | None,
    concurrency: int,
    processes: bool,
) -> Iterator[Any]:
    """The per-element form ("element-mp"): each record crosses to a ProcessPoolExecutor."""
    from concurrent.futures import ProcessPoolExecutor

    from spdl.pipeline import PipelineBuilder

    executor = ProcessPoolExecutor(max_workers=concurrency) if processes else None
    builder = (
        PipelineBuilder()
        .add_source(source)
        .pipe(op, concurrency=concurrency, executor=executor)
        .aggregate(batch, drop_last=True)
    )
    if collate is not None:
        builder = builder.pipe(collate)
    return spdl_iter(builder.add_sink(3).build(num_threads=max(1, concurrency)))


def nodes_batched(
    source: Any, map_and_collate: Callable[[Any], Any], batch: int, workers: int, variant: str
) -> Iterator[Any]:
    """torchdata.nodes as its migration guide builds a DataLoader (see VARIANTS)."""
    import torchdata.nodes as tn

    node: Any = tn.Batcher(tn.IterableWrapper(source), batch_size=batch, drop_last=True)
    if variant == "batch-inline":  # num_workers=0: the map runs in the consumer's thread
        return iter(tn.Loader(tn.Mapper(node, map_and_collate)))
    kind, _, order = variant.removeprefix("batch-").partition("-")
    node = tn.ParallelMapper(
        node,
        map_fn=map_and_collate,
        num_workers=workers,
        method=kind,
        in_order=order != "unordered",
    )
    node = tn.Prefetcher(node, prefetch_factor=workers * 2)
    return iter(tn.Loader(node))


def nodes_loader(
    source: Any,
    op: Callable[[Any], Any],
    batch: int,
    collate: Callable[[Any], Any],
    workers: int,
    method: str,
    prefetch: bool = True,
) -> Iterator[Any]:
    """The per-element form ("element-process"): one record per ParallelMapper task."""
    import torchdata.nodes as tn

    node: Any = tn.IterableWrapper(source)
    node = tn.ParallelMapper(node, map_fn=op, num_workers=workers, method=method)
    node = tn.Batcher(node, batch_size=batch, drop_last=True)
    node = tn.Mapper(node, collate)
    if prefetch:
        node = tn.Prefetcher(node, prefetch_factor=2)
    return iter(tn.Loader(node))


def _corpus_paths() -> tuple[Path, Path]:
    return OUT / f"corpus_{CORPUS}.jsonl", OUT / f"corpus_{CORPUS}.array_record"


def _image_paths(quick: bool) -> list[str]:
    return bench_image.make_images(IMAGES_QUICK if quick else IMAGES_FULL)


def _rows(batch: Any) -> int:
    return len(batch["description"])


def _converted(fmt: str) -> Path:
    return PEERS_OUT / f"corpus_{CORPUS}.{fmt}"


def _mosaic_iter() -> Iterator[Any]:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()  # what an earlier, killed measurement left in /dev/shm

    class TextDataset(StreamingDataset):
        def __getitem__(self, idx: int) -> Any:
            return parse_tokenize_pad(super().__getitem__(idx)["json"])

    ds = TextDataset(
        local=str(_converted("mds")), shuffle=True, shuffle_seed=42, batch_size=TEXT_BATCH
    )
    loader: Any = DataLoader(
        ds,
        batch_size=TEXT_BATCH,
        num_workers=2,
        drop_last=True,
        collate_fn=stack_rows,
        persistent_workers=True,  # workers kept across epochs: no respawn at each boundary
    )
    while True:
        yield from loader


def _litdata_iter() -> Iterator[Any]:
    import litdata

    ds = litdata.StreamingDataset(
        str(_converted("litdata")), shuffle=True, seed=42, transform=_litdata_work
    )
    loader = litdata.StreamingDataLoader(
        ds,
        batch_size=TEXT_BATCH,
        num_workers=2,
        drop_last=True,
        collate_fn=stack_rows,
        persistent_workers=True,  # workers kept across epochs: no respawn at each boundary
    )
    while True:
        yield from loader


def _litdata_work(item: dict[str, Any]) -> dict[str, Any]:
    return parse_tokenize_pad(item["json"])


def _chute_stream() -> Iterator[Any]:
    ds = (
        chute.MapDataset.source(chute.sources.RecordFileDataSource(_converted("crec")))
        .map(json.loads)
        .map(Tokenize())
        .shuffle(seed=42)
        .repeat(num_epochs=100)
        .map(bench_torch.trim_and_pad)
        .batch(TEXT_BATCH, drop_remainder=True)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    )
    return iter(ds)


def make_iter(
    key: str, lib: str, quick: bool, variant: str | None = None
) -> tuple[Iterator[Any], Callable[[Any], int]]:
    """A fresh iterator of `lib` on row `key` (its `variant`, else BEST's), and how to
    count a batch's items."""
    _, ar = _corpus_paths()
    variant = variant or BEST.get((key, lib), "")
    if key in ("text0", "text2"):
        workers = 0 if key == "text0" else 2
        if lib == "chute":
            ds = bench_torch.text_dataset("chute", ar, 0)
            if workers:
                ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
            return iter(ds), _rows
        source = text_indices(CORPUS)
        collate = partial(text_batch, str(ar))
        if lib == "spdl":
            if variant == "element-mp":
                op = partial(text_row, str(ar))
                return spdl_pipeline(source, op, TEXT_BATCH, stack_rows, 2, True), _rows
            return spdl_batched(source, collate, TEXT_BATCH, max(1, workers), variant), _rows
        if lib == "torchdata.nodes":
            if variant == "element-process":
                op = partial(text_row, str(ar))
                return nodes_loader(source, op, TEXT_BATCH, stack_rows, 2, "process"), _rows
            return nodes_batched(source, collate, TEXT_BATCH, workers, variant), _rows
    if key in ("image_proc", "image_thread"):
        paths = _image_paths(quick)
        procs = key == "image_proc"
        if lib == "chute":
            if procs:
                return iter(bench_image.dataset("chute", paths, 2)), len
            ds = (
                chute.MapDataset.source(paths)
                .shuffle(seed=7)
                .repeat()
                .random_map(bench_image.load_and_augment, seed=3)
                .batch(IMAGE_BATCH)
                .to_iter_dataset(chute.ReadOptions(num_threads=2))
            )
            return iter(ds), len
        if lib == "spdl":
            return spdl_batched(image_items(paths), image_batch, IMAGE_BATCH, 2, variant), len
        if lib == "torchdata.nodes":
            return nodes_batched(image_items(paths), image_batch, IMAGE_BATCH, 2, variant), len
    if key == "overhead":
        raise ValueError("overhead is timed whole: see overhead_rate")
    if key == "stream":
        if lib == "chute":
            return _chute_stream(), _rows
        if lib == "mosaic":
            return _mosaic_iter(), _rows
        if lib == "litdata":
            return _litdata_iter(), _rows
    raise ValueError(f"no {lib!r} contender in row {key!r}; rows: {[s.key for s in SPECS]}")


def overhead_rate(lib: str, n: int, variant: str = "element") -> float:
    """Elements/s of one whole pass over range(n), shuffled, doubled, batched by 32 (the
    library imported before the clock starts, as in the suite's overhead row). A peer's
    "batched" variant batches first and doubles a whole batch per task, as both peers'
    docs do with costly per-element work (VARIANTS)."""
    if lib == "chute":
        t0 = time.perf_counter()
        count = bench_core.chute_dataset(n)
    elif lib == "spdl":
        from spdl.pipeline import PipelineBuilder

        t0 = time.perf_counter()
        count = 0
        builder = PipelineBuilder().add_source(np.random.default_rng(1).permutation(n).tolist())
        if variant == "batched":
            builder = builder.aggregate(32).pipe(double_batch)
        else:
            builder = builder.pipe(double).aggregate(32)
        pipeline = builder.add_sink(3).build(num_threads=1)
        with pipeline.auto_stop():
            for batch in pipeline.get_iterator():
                count += len(batch)
    elif lib == "torchdata.nodes":
        import torchdata.nodes as tn

        t0 = time.perf_counter()
        count = 0
        perm = np.random.default_rng(1).permutation(n).tolist()
        node: Any = tn.IterableWrapper(perm)
        if variant == "batched":
            node = tn.Mapper(tn.Batcher(node, batch_size=32, drop_last=False), double_batch)
        else:
            node = tn.Batcher(tn.Mapper(node, double), batch_size=32, drop_last=False)
        for batch in tn.Loader(node):
            count += len(batch)
    else:
        raise ValueError(f"no {lib!r} contender in row 'overhead'")
    if count != n:
        raise AssertionError(f"overhead: {lib} gave {count} elements, not {n}")
    return count / (time.perf_counter() - t0)


# -- preparing the converted corpus (runs in .venv-peers, once) ------------------------------


def _litdata_record(line: str) -> dict[str, str]:
    return {"json": line}


def prepare() -> dict[str, float]:
    """The corpus as .crec, MDS and LitData chunks under bench_out/peers/, each written
    once; returns the seconds each write took (absent when already there)."""
    jsonl, ar = _corpus_paths()
    if not jsonl.exists() or not ar.exists():
        raise SystemExit(f"{jsonl} or {ar} missing: run_all.py makes them (bench_torch.corpus)")
    lines = jsonl.read_text().splitlines()
    PEERS_OUT.mkdir(parents=True, exist_ok=True)
    took: dict[str, float] = {}
    crec = _converted("crec")
    if not crec.exists():
        t0 = time.perf_counter()
        tmp = crec.with_name(crec.name + ".partial")
        with chute.records.RecordWriter(tmp) as w:
            for line in lines:
                w.write(line.encode())
        tmp.rename(crec)
        took["crec"] = time.perf_counter() - t0
    mds = _converted("mds")
    if not mds.exists():
        from streaming import MDSWriter

        t0 = time.perf_counter()
        tmp = mds.with_name(mds.name + ".partial")
        with MDSWriter(out=str(tmp), columns={"json": "str"}, size_limit=SHARD_BYTES) as w:
            for line in lines:
                w.write({"json": line})
        tmp.rename(mds)
        took["mds"] = time.perf_counter() - t0
    lit = _converted("litdata")
    if not lit.exists():
        import litdata

        t0 = time.perf_counter()
        tmp = lit.with_name(lit.name + ".partial")
        litdata.optimize(
            fn=_litdata_record,
            inputs=lines,
            output_dir=str(tmp),
            chunk_bytes=SHARD_BYTES,
            num_workers=1,
            verbose=False,
        )
        tmp.rename(lit)
        took["litdata"] = time.perf_counter() - t0
    return took


# -- one measurement (runs in .venv-peers, a fresh process each) ------------------------------


def measure_one(
    key: str, lib: str, seconds: float, quick: bool, variant: str | None = None
) -> dict[str, float]:
    import warnings

    warnings.filterwarnings("ignore")
    if key == "overhead":
        variant = variant or BEST.get((key, lib), "element")
        full = OVERHEAD_N_BATCHED.get(lib, OVERHEAD_N[lib]) if variant == "batched" else None
        n = (full or OVERHEAD_N[lib]) // (4 if quick else 1)
        return {"rate": overhead_rate(lib, n, variant)}
    it, size = make_iter(key, lib, quick, variant)
    rate, first_s = bench_torch.rate_after_first(it, seconds, size=size)
    return {"rate": rate, "first_s": first_s}


# -- the driver (runs in any Python) ----------------------------------------------------------


def load1() -> float:
    return os.getloadavg()[0]


@dataclass
class Result:
    spec: Spec
    rounds: dict[str, list[float]]  # contender -> rate of each round, in round order
    load_start: float
    load_end: float
    errors: dict[str, str]

    def median(self, lib: str) -> float | None:
        r = self.rounds.get(lib)
        return statistics.median(r) if r else None

    def spread(self, lib: str) -> float | None:
        """(slowest - fastest) / median of the rounds, a fraction."""
        r, m = self.rounds.get(lib), self.median(lib)
        return (max(r) - min(r)) / m if r and m else None

    def rounds_ahead(self, lib: str) -> tuple[int, int]:
        """(rounds where `lib` beat chute, rounds both ran), round by round."""
        p, c = self.rounds.get(lib, []), self.rounds.get("chute", [])
        pairs = list(zip(p, c))
        return sum(a > b for a, b in pairs), len(pairs)

    def beats_chute(self, lib: str) -> bool:
        """Every round of `lib` faster than every round of chute."""
        p, c = self.rounds.get(lib), self.rounds.get("chute")
        return bool(p and c and min(p) > max(c))


def run_one(
    exe: Path, key: str, lib: str, seconds: float, quick: bool, variant: str | None = None
) -> dict[str, float]:
    cmd = [str(exe), str(Path(__file__).resolve()), "measure", key, lib, f"--seconds={seconds}"]
    if quick:
        cmd.append("--quick")
    if variant:
        cmd.append(f"--variant={variant}")
    # A temporary folder of its own, removed after: Streaming leaves lock files there.
    tmp = tempfile.mkdtemp(prefix="chute-peers-")
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "TMPDIR": tmp},
    )
    try:
        stdout, stderr = proc.communicate(timeout=120 + 10 * seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the measurement and whatever it started
        stdout, stderr = proc.communicate()
        raise RuntimeError(f"{lib} on {key}: no result in {120 + 10 * seconds:.0f} s") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        tail = (stderr or stdout).strip().splitlines()[-6:]
        raise RuntimeError(f"{lib} on {key} exited {proc.returncode}: " + " | ".join(tail))
    out: dict[str, float] = json.loads(lines[-1])
    return out


def collect(
    exe: Path,
    quick: bool,
    rounds: int,
    seconds: float,
    only: list[str] | None = None,
    log: Callable[[str], None] = print,
) -> list[Result]:
    """Each row's rounds, contenders alternating, the order turning each round."""
    took = run_prepare(exe)
    if took:
        log("# converted the corpus: " + ", ".join(f"{k} {v:.1f} s" for k, v in took.items()))
    results = []
    for spec in SPECS:
        if only and spec.key not in only:
            continue
        load_start = load1()
        log(f"# {spec.key}: load {load_start:.2f} at the start")
        errors: dict[str, str] = {}
        libs = list(spec.contenders)
        for lib in libs:  # warm-up: page cache, bytecode, the forkserver's imports
            try:
                run_one(exe, spec.key, lib, min(0.5, seconds), quick)
            except Exception as e:  # recorded; the row goes on without it
                errors[lib] = str(e)
        got: dict[str, list[float]] = {lib: [] for lib in libs if lib not in errors}
        for r in range(rounds):
            order = [libs[(r + k) % len(libs)] for k in range(len(libs))]
            for lib in order:
                if lib in errors:
                    continue
                try:
                    got[lib].append(run_one(exe, spec.key, lib, seconds, quick)["rate"])
                except Exception as e:
                    errors[lib] = str(e)
                    got.pop(lib, None)
            log(
                f"#   round {r + 1}: "
                + ", ".join(f"{lib} {got[lib][-1]:,.0f}" for lib in order if lib in got)
            )
        res = Result(spec, got, load_start, load1(), errors)
        log(f"# {spec.key}: load {res.load_end:.2f} at the end")
        for lib, err in errors.items():
            log(f"# {spec.key}: {lib} failed: {err}")
        results.append(res)
    return results


def run_prepare(exe: Path) -> dict[str, float]:
    p = subprocess.run(
        [str(exe), str(Path(__file__).resolve()), "prepare"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if p.returncode != 0:
        raise RuntimeError("preparing the converted corpus failed:\n" + p.stderr[-3000:])
    out: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def variants_table(rows: list[str] | None, rounds: int, seconds: float, quick: bool) -> None:
    """Each (row, peer)'s documented variants, `rounds` rounds each, the variants
    alternating; prints each round, the medians and the fastest (to be kept in BEST)."""
    exe = python()
    if exe is None:
        raise SystemExit(missing_message())
    print(f"# peers' Python: {exe}: {versions(exe)}; load {load1():.2f}", flush=True)
    for (key, lib), names in VARIANTS.items():
        if rows and key not in rows:
            continue
        got: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                try:
                    got[name].append(run_one(exe, key, lib, seconds, quick, name)["rate"])
                except Exception as e:  # reported; the others go on
                    print(f"# {key} {lib} {name}: failed: {str(e)[-300:]}", flush=True)
        med = {n: statistics.median(v) for n, v in got.items() if v}
        best = max(med, key=lambda n: med[n]) if med else "-"
        for n in names:
            runs = ", ".join(f"{x:,.0f}" for x in got[n])
            figure = f"{med[n]:>12,.0f}" if n in med else f"{'failed':>12}"
            print(f"{key:<13} {lib:<16} {n:<24} {figure}   rounds: {runs}", flush=True)
        print(
            f"{key:<13} {lib:<16} fastest: {best} (BEST: {BEST.get((key, lib))}); "
            f"load {load1():.2f}",
            flush=True,
        )


def versions(exe: Path) -> str:
    code = (
        "import importlib.metadata as m, sys; print(f'Python {sys.version.split()[0]}; ' + "
        "', '.join(f'{p} {m.version(p)}' for p in ('chute', 'numpy', 'torch', 'tokenizers', "
        "'spdl', 'torchdata', 'mosaicml-streaming', 'litdata')))"
    )
    return subprocess.run([str(exe), "-c", code], capture_output=True, text=True).stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="write the converted corpus (in .venv-peers)")
    m = sub.add_parser("measure", help="one measurement, printed as JSON (in .venv-peers)")
    m.add_argument("key", choices=[s.key for s in SPECS])
    m.add_argument("lib", choices=("chute", *PEERS))
    m.add_argument("--seconds", type=float, default=3.0)
    m.add_argument("--quick", action="store_true")
    m.add_argument("--variant", default=None, help="one of VARIANTS[(key, lib)]")
    v = sub.add_parser("variants", help="measure each peer's documented variants (any Python)")
    v.add_argument("--rows", nargs="*", default=None, help="row keys (default: all)")
    v.add_argument("--rounds", type=int, default=3)
    v.add_argument("--seconds", type=float, default=1.5)
    v.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.cmd == "variants":
        variants_table(args.rows, args.rounds, args.seconds, args.quick)
        return
    if args.cmd == "prepare":
        print(json.dumps(prepare()))
    else:
        out = measure_one(args.key, args.lib, args.seconds, args.quick, args.variant)
        print(json.dumps(out), flush=True)
    sys.stdout.flush()
    # A peer's worker processes left running (torchdata.nodes' have no close) would hold
    # the pipe to the driver open, and its threads the exit: end them, then leave.
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:  # it ended on its own meanwhile
            pass
    psutil.wait_procs(children, timeout=10)
    if args.cmd == "measure" and args.lib == "mosaic":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()  # the exit below skips Streaming's own clean-up
    os._exit(0)


if __name__ == "__main__":
    main()
