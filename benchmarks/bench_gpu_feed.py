"""Feeding a GPU training step: the share of each step spent waiting for data, JAX and
PyTorch, for seed 003's text pipeline and the image pipeline.

Pipelines (each contender computes exactly the same elements):
- text (seed 003, as examples/demo.py): JSON lines of the corpus made by
  shared/data/make_corpus.py, `json.loads`, bert-base-uncased tokenizer (`tokenizers`),
  global shuffle, repeat, trim/pad to 128 tokens, batches of 256.
- image (benchmarks/bench_image.py): JPEG files, Pillow decode, random 224x224 crop and
  flip, batches of 64 uint8 pictures (9.6 MB).

The step: a stand-in training step whose cost is a loop of `k` matmuls (width x width,
bf16 on a GPU) started from the batch (it reads every array of it); `k` is calibrated at
start, per framework and pipeline, so that one step takes about as long as the pipeline
takes to make one batch on one thread (where overlapping matters most).

Feeds, interleaved round by round, medians over rounds:
- (a) `no prefetch`: the pipeline computed in the loop's thread (no threads, no workers),
  then the copy in the loop (JAX `jax.device_put`; torch `.to(device)` from pageable
  memory).
- (b) `chute`: the pipeline in `--workers` chute worker processes (`mp_prefetch`), then
  JAX: `chute.experimental.device_put` (copies started on its thread, 2 batches ahead);
  torch: `chute.torch.pin_memory(ds)` (pinned on its thread, 2 batches ahead) and
  `.to(device, non_blocking=True)` in the loop.
- (c) the peer's own way: JAX: the same chute pipeline in workers and `jax.device_put` in
  the loop (seed 000's loop); torch: `DataLoader(num_workers=--workers, pin_memory=True)`
  over a map-style Dataset doing the same work (forkserver workers: JAX and CUDA threads
  run in this process) and `.to(device, non_blocking=True)` in the loop.

Each step: `t0`, take the batch and wait until it is on the device (JAX
`block_until_ready`; torch: the copy issued, then the stream synchronized), `t1`, run the
step and wait for its loss (the loop logs it), `t2`. Waiting share = sum(t1 - t0) /
sum(t2 - t0). H2D MB/s = bytes of the batches moved to the device / loop time; the raw
copy rate (pageable and pinned) is measured once at start.

    PYTHONPATH=src python benchmarks/bench_gpu_feed.py [--quick] [--device cpu|auto]
        [--data DIR] [--images DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from demo import Tokenize, trim_and_pad

import chute
from _harness import shared_data, table
from bench_image import augment, decode, make_images

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "2026-11-27" / "bench_gpu_feed.txt"
TEXT_BATCH = 256
IMAGE_BATCH = 64
REPEAT = 1000  # the torch Datasets' length: this many passes over the files, one epoch


# -- the pipelines -------------------------------------------------------------------------


def load_and_augment(path: str, rng: np.random.Generator) -> np.ndarray:
    return augment(decode(path), rng)


def batched(ds: chute.MapDataset[Any], batch: int, workers: int) -> chute.IterDataset[Any]:
    """Without workers: elements read in the loop's thread, one batch when asked for
    (nothing computed ahead beyond the block being read). With workers: batched in them
    (`mp_prefetch` then ships whole batches), with seed 003's read options, as
    examples/demo.py does. The batches are the same."""
    if not workers:
        options = chute.ReadOptions(num_threads=0, prefetch_buffer_size=0)
        return ds.to_iter_dataset(options).batch(batch, drop_remainder=True)
    return (
        ds.batch(batch, drop_remainder=True)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    )


def chute_text(lines: list[str], tokenizer: Path, workers: int) -> chute.IterDataset[Any]:
    ds = (
        chute.MapDataset.source(lines)
        .map(json.loads)
        .map(Tokenize(tokenizer))
        .shuffle(seed=42)
        .repeat()
        .map(trim_and_pad)
    )
    return batched(ds, TEXT_BATCH, workers)


def chute_images(paths: list[str], workers: int) -> chute.IterDataset[Any]:
    ds = (
        chute.MapDataset.source(paths).shuffle(seed=7).repeat().random_map(load_and_augment, seed=3)
    )
    return batched(ds, IMAGE_BATCH, workers)


class TorchText:
    """A map-style torch Dataset doing the text pipeline's per-element work."""

    def __init__(self, lines: list[str], tokenizer: Path) -> None:
        self.lines = lines
        self.tokenize = Tokenize(tokenizer)

    def __len__(self) -> int:
        return len(self.lines) * REPEAT

    def __getitem__(self, i: int) -> dict[str, Any]:
        record = json.loads(self.lines[i % len(self.lines)])
        return trim_and_pad(self.tokenize.map(record))


class TorchImages:
    """A map-style torch Dataset doing the image pipeline's per-element work."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths) * REPEAT

    def __getitem__(self, i: int) -> np.ndarray:
        return load_and_augment(self.paths[i % len(self.paths)], np.random.default_rng([3, i]))


def torch_loader(dataset: Any, batch: int, workers: int) -> Iterator[Any]:
    """torch's recipe: `DataLoader(..., num_workers, pin_memory=True)`."""
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(7)
    loader = DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=True,
        multiprocessing_context="forkserver" if workers else None,
    )
    yield from loader  # one epoch is REPEAT passes: longer than any run here


def batch_seconds(make: Callable[[], Any], n: int) -> float:
    """The mean time the pipeline takes to make one batch in this thread, over `n` batches
    after the first (a mean: the reader computes runs of several batches at a time)."""
    it = iter(make())
    next(it)
    t0 = time.perf_counter()
    for _ in range(n):
        next(it)
    seconds = (time.perf_counter() - t0) / n
    it.close()
    return seconds


# -- the frameworks --------------------------------------------------------------------------


class Jax:
    name = "JAX"

    def __init__(self, device: str, width: int) -> None:
        import jax
        import jax.numpy as jnp

        self.jax = jax
        self.device = jax.devices("cpu" if device == "cpu" else None)[0]
        on_gpu = self.device.platform != "cpu"
        dtype = jnp.bfloat16 if on_gpu else jnp.float32
        width = width or (8192 if on_gpu else 128)
        w = jax.random.normal(jax.random.PRNGKey(0), (width, width), jnp.float32) / width**0.5
        h0 = jax.random.normal(jax.random.PRNGKey(1), (width, width), jnp.float32)
        self.w = jax.device_put(w.astype(dtype), self.device)
        self.h0 = jax.device_put(h0.astype(dtype), self.device)

        @jax.jit
        def step(w: Any, h0: Any, batch: Any, k: Any) -> Any:
            z = sum(jnp.mean(x.astype(jnp.float32)) for x in jax.tree.leaves(batch))
            h = jnp.tanh(h0 * jnp.asarray(1 + 1e-6 * z, dtype))
            h = jax.lax.fori_loop(0, k, lambda _, h: jnp.tanh(h @ w), h)
            return jnp.mean(jnp.square(h.astype(jnp.float32)))

        self._step = step

    def describe(self) -> str:
        d = self.device
        version = getattr(getattr(d, "client", None), "platform_version", "?")
        return f"jax {self.jax.__version__} on {d.platform} ({d.device_kind}; {version})"

    def put(self, batch: Any) -> Any:
        return self.jax.block_until_ready(self.jax.device_put(batch, self.device))

    def ready(self, batch: Any) -> Any:
        return self.jax.block_until_ready(batch)

    def step(self, batch: Any, k: int) -> float:
        return float(self.jax.block_until_ready(self._step(self.w, self.h0, batch, k)))

    def nbytes(self, batch: Any) -> int:
        return sum(x.nbytes for x in self.jax.tree.leaves(batch))

    def copy_rates(self, nbytes: int) -> str:
        """MB/s of `jax.device_put` from ordinary (pageable) numpy memory."""
        x = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        self.put(x)
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            self.put(x)
            times.append(time.perf_counter() - t0)
        return f"jax.device_put {nbytes / 1e6:.1f} MB numpy: {nbytes / statistics.median(times) / 1e6:,.0f} MB/s"

    def feeds(
        self, pipeline: Callable[[int], Any], workers: int, torch_peer: Any, more: bool
    ) -> dict[str, Any]:
        def loop_put(it: Any) -> Callable[[], Any]:
            return lambda: self.put(next(it))

        def chute_put(it: Any) -> Callable[[], Any]:
            return lambda: self.ready(next(it))

        feeds = {
            "(a) no prefetch": (
                lambda: iter(pipeline(0)),
                loop_put,
                "loop thread: pipeline, then jax.device_put",
            ),
            "(b) chute device_put": (
                lambda: iter(chute.experimental.device_put(pipeline(workers), self.device)),
                chute_put,
                "chute's transfer thread, 2 batches ahead",
            ),
            "(c) jax.device_put in loop": (
                lambda: iter(pipeline(workers)),
                loop_put,
                "loop thread: jax.device_put (pipeline in workers)",
            ),
        }
        if more:
            feeds["(b) device_put 16/4"] = (
                lambda: iter(
                    chute.experimental.device_put(
                        pipeline(workers), self.device, cpu_buffer_size=16, device_buffer_size=4
                    )
                ),
                chute_put,
                "chute's transfer thread, 4 batches ahead",
            )
        return feeds


class Torch:
    name = "torch"

    def __init__(self, device: str, width: int) -> None:
        import torch

        import chute.torch  # noqa: F401 (chute.torch.to_tensors, pin_memory)

        self.torch = torch
        torch.set_grad_enabled(False)
        self.cuda = device != "cpu" and torch.cuda.is_available()
        if not self.cuda:
            torch.set_num_threads(1)  # the step on the loop's thread, beside the workers
        self.device = torch.device("cuda" if self.cuda else "cpu")
        dtype = torch.bfloat16 if self.cuda else torch.float32
        width = width or (8192 if self.cuda else 128)
        g = torch.Generator().manual_seed(0)
        self.w = (torch.randn(width, width, generator=g) / width**0.5).to(self.device, dtype)
        self.h0 = torch.randn(width, width, generator=g).to(self.device, dtype)
        self.dtype = dtype

    def describe(self) -> str:
        t = self.torch
        if not self.cuda:
            return f"torch {t.__version__} on cpu"
        return f"torch {t.__version__} (CUDA {t.version.cuda}) on {t.cuda.get_device_name()}"

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.current_stream().synchronize()

    def to_device(self, batch: Any, non_blocking: bool) -> Any:
        tree = chute.torch.to_tensors(batch)
        if isinstance(tree, dict):
            out = {k: v.to(self.device, non_blocking=non_blocking) for k, v in tree.items()}
        else:
            out = tree.to(self.device, non_blocking=non_blocking)
        self._sync()
        return out

    def put(self, batch: Any) -> Any:
        return self.to_device(batch, non_blocking=False)

    def ready(self, batch: Any) -> Any:
        return self.to_device(batch, non_blocking=True)

    def step(self, batch: Any, k: int) -> float:
        torch = self.torch
        leaves = list(batch.values()) if isinstance(batch, dict) else [batch]
        z = sum(x.float().mean() for x in leaves)
        h = torch.tanh(self.h0 * (1 + 1e-6 * z).to(self.dtype))
        for _ in range(k):
            h = torch.tanh(h @ self.w)
        loss = h.float().square().mean()
        self._sync()
        return float(loss)

    def nbytes(self, batch: Any) -> int:
        leaves = list(batch.values()) if isinstance(batch, dict) else [batch]
        return sum(x.numel() * x.element_size() for x in leaves)

    def copy_rates(self, nbytes: int) -> str:
        """MB/s of `.to(device)` from pageable and from pinned memory."""
        torch = self.torch
        x = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        out = []
        for label, src, nb in (("pageable", x, False), ("pinned", chute.torch.pin_memory(x), True)):
            src.to(self.device, non_blocking=nb)
            self._sync()
            times = []
            for _ in range(10):
                t0 = time.perf_counter()
                src.to(self.device, non_blocking=nb)
                self._sync()
                times.append(time.perf_counter() - t0)
            out.append(f"{label} {nbytes / statistics.median(times) / 1e6:,.0f} MB/s")
        return f"torch .to(device) {nbytes / 1e6:.1f} MB: " + ", ".join(out)

    def feeds(
        self, pipeline: Callable[[int], Any], workers: int, torch_peer: Any, more: bool
    ) -> dict[str, Any]:
        def loop_put(it: Any) -> Callable[[], Any]:
            return lambda: self.put(next(it))

        def pinned(it: Any) -> Callable[[], Any]:
            return lambda: self.ready(next(it))

        feeds = {
            "(a) no prefetch": (
                lambda: iter(pipeline(0)),
                loop_put,
                "loop thread: pipeline, then .to(device) from pageable memory",
            ),
            "(b) chute pin_memory(ds)": (
                lambda: iter(chute.torch.pin_memory(pipeline(workers))),
                pinned,
                "pinned on chute's thread; .to(non_blocking) issued by the loop",
            ),
            "(c) DataLoader(pin_memory)": (
                lambda: torch_peer(workers),
                pinned,
                "pinned on DataLoader's pin thread; .to(non_blocking) by the loop",
            ),
        }
        if more:
            feeds["(b) pin_memory(ds, 8)"] = (
                lambda: iter(chute.torch.pin_memory(pipeline(workers), buffer_size=8)),
                pinned,
                "pinned on chute's thread, 8 ahead; .to(non_blocking) by the loop",
            )
        return feeds


# -- measuring -------------------------------------------------------------------------------


def calibrate(fw: Any, batch: Any, target: float, quick: bool) -> tuple[int, float]:
    """`k` for a step as long as `target` seconds (its time is `a + b k`: reading the
    batch, then the matmuls), and the step's seconds at `k`."""

    def seconds(k: int, n: int) -> float:
        fw.step(batch, k)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fw.step(batch, k)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    base = seconds(0, 3)
    k = 1
    while base < target:
        t = seconds(k, 3)
        if t - base >= target / 4 or k >= 1 << 16:
            k = max(1, round(k * (target - base) / max(t - base, 1e-9)))
            break
        k *= 4
    else:
        k = 0  # reading the batch alone takes longer than making it
    return k, seconds(k, 3 if quick else 7)


class Run(NamedTuple):
    share: float  # of the loop's time spent waiting for batches
    wait_ms: float  # per step, mean
    step_ms: float  # per step, waiting included
    h2d_mb_s: float  # bytes moved to the device / loop time
    waits_ms: list[float]  # each step's wait
    threads: str  # the threads beside the loop's, mid-run


def run_loop(fw: Any, get: Callable[[], Any], k: int, steps: int, warmup_s: float) -> Run:
    """`steps` steps after a warm-up of at least 5 steps and `warmup_s` seconds from the
    first batch (workers started, buffers filled)."""
    fw.step(get(), k)
    warm_until = time.perf_counter() + warmup_s
    for _ in range(5):
        fw.step(get(), k)
    while time.perf_counter() < warm_until:
        fw.step(get(), k)
    waits = []
    total = 0.0
    moved = 0
    threads = ""
    for i in range(steps):
        t0 = time.perf_counter()
        batch = get()
        t1 = time.perf_counter()
        fw.step(batch, k)
        t2 = time.perf_counter()
        waits.append(t1 - t0)
        total += t2 - t0
        moved += fw.nbytes(batch)
        if i == steps // 2:
            names = sorted(
                t.name for t in threading.enumerate() if t is not threading.main_thread()
            )
            threads = ", ".join(f"{n} x{names.count(n)}" for n in dict.fromkeys(names)) or "none"
    waited = sum(waits)
    return Run(
        waited / total,
        1000 * waited / steps,
        1000 * total / steps,
        moved / total / 1e6,
        [1000 * w for w in waits],
        threads,
    )


def close(it: Any) -> None:
    closer = getattr(it, "close", None)
    if closer is not None:
        closer()
    gc.collect()


def machine_lines(fws: list[Any]) -> list[str]:
    lines = [
        f"# host: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"numpy {np.__version__}, chute from {Path(chute.__file__).parent}"
    ]
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        if smi:
            lines.append(f"# nvidia-smi: {smi}")
    except (OSError, subprocess.TimeoutExpired):
        pass
    lines += [f"# {fw.describe()}" for fw in fws]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument(
        "--width", type=int, default=0, help="the step's matmul size (0: 8192 on a GPU, 128 on CPU)"
    )
    p.add_argument(
        "--data", type=Path, default=None, help="folder with the tokenizer and corpus.jsonl"
    )
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument(
        "--images", type=Path, default=None, help="folder of JPEG files (default: bench_image's)"
    )
    p.add_argument("--frameworks", default="jax,torch")
    p.add_argument("--pipelines", default="text,image")
    p.add_argument(
        "--more", action="store_true", help="also (b) with larger buffers than the defaults"
    )
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per contender")
    p.add_argument("--feeds", default="", help="only the feeds starting so, e.g. '(b),(c)'")
    p.add_argument(
        "--switch-interval",
        type=float,
        default=0.0,
        help="also each feed with sys.setswitchinterval(this) (seconds; Python's default 0.005)",
    )
    p.add_argument(
        "--budget-s", type=float, default=0, help="start no contender after this (0: none)"
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--note", default="")
    args = p.parse_args()
    started = time.perf_counter()
    faulthandler.dump_traceback_later(
        max(60.0, args.budget_s * 1.5) if args.budget_s else 1800, exit=True
    )
    warnings.filterwarnings("ignore")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX beside torch

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    data = args.data or shared_data()
    tokenizer = data / "bert-base-uncased.tokenizer.json"
    corpus = data / "corpus.jsonl"
    if not corpus.exists():
        corpus = (
            Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_gpu_feed_corpus_{args.records}.jsonl"
        )
        if not corpus.exists():
            subprocess.run(
                [sys.executable, str(data / "make_corpus.py"), str(corpus), str(args.records)],
                check=True,
                capture_output=True,
            )
    lines = corpus.read_text().splitlines()[: args.records]
    if args.images:
        paths = sorted(str(p) for p in args.images.glob("*.jpg"))
    else:
        paths = make_images(128)

    quick = args.quick
    rounds = args.rounds or (1 if quick else 2)
    kinds = {"jax": Jax, "torch": Torch}
    fws: list[Any] = [kinds[name](args.device, args.width) for name in args.frameworks.split(",")]
    log("frameworks: " + "; ".join(fw.describe() for fw in fws))

    pipelines: dict[str, tuple[Callable[[int], Any], Callable[[int], Any]]] = {
        "text": (
            lambda w: chute_text(lines, tokenizer, w),
            lambda w: torch_loader(TorchText(lines, tokenizer), TEXT_BATCH, w),
        ),
        "image": (
            lambda w: chute_images(paths, w),
            lambda w: torch_loader(TorchImages(paths), IMAGE_BATCH, w),
        ),
    }
    header = [
        "# bench_gpu_feed: the share of each training step spent waiting for data",
        *machine_lines(fws),
        f"# text: {len(lines):,} records, batches of {TEXT_BATCH} x 128 tokens; image: "
        f"{len(paths)} JPEGs, batches of {IMAGE_BATCH} x 224x224x3 uint8; (b) and (c) use "
        f"{args.workers} worker processes",
        *([f"# {args.note}"] if args.note else []),
    ]
    notes: list[str] = []
    rows: list[list[str]] = []
    threads_seen: list[str] = []

    def write() -> None:
        text = "\n".join(
            [
                *header,
                *notes,
                f"# {rounds} round(s), contenders interleaved; medians over rounds",
                "",
                table(
                    [
                        "pipeline",
                        "framework",
                        "feed",
                        "waiting",
                        "wait ms",
                        "p50/p99/max",
                        "ms/step",
                        "H2D MB/s",
                        "copy runs on",
                    ],
                    rows,
                )
                if rows
                else "(no results)",
                "",
                "# threads beside the loop's, seen mid-run:",
                *threads_seen,
            ]
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")

    for pname in args.pipelines.split(","):
        chute_pipe, torch_pipe = pipelines[pname]
        batch_s = batch_seconds(functools.partial(chute_pipe, 0), 8 if quick else 24)
        host_batch = next(iter(chute_pipe(0)))
        nbytes = sum(
            x.nbytes
            for x in (host_batch.values() if isinstance(host_batch, dict) else [host_batch])
        )
        notes.append(
            f"# {pname}: one batch ({nbytes / 1e6:.2f} MB) takes {1000 * batch_s:.1f} ms on one thread"
        )
        runs: dict[tuple[str, str], Any] = {}
        steps = 5 if quick else max(10, min(400, int(args.seconds / batch_s)))
        for fw in fws:
            k, step_s = calibrate(fw, fw.put(host_batch), batch_s, quick)
            notes.append(
                f"#   {fw.name}: step = {k} matmuls of {fw.w.shape[0]}, {1000 * step_s:.1f} ms; "
                f"{fw.copy_rates(nbytes)}"
            )
            log(notes[-1])
            for feed, spec in fw.feeds(chute_pipe, args.workers, torch_pipe, args.more).items():
                if args.feeds and not feed.startswith(tuple(args.feeds.split(","))):
                    continue
                runs[(fw.name, feed)] = (fw, k, spec, None)
                if args.switch_interval:
                    twin = f"{feed}, switch {1000 * args.switch_interval:g} ms"
                    runs[(fw.name, twin)] = (fw, k, spec, args.switch_interval)
        results: dict[tuple[str, str], list[Run]] = {key: [] for key in runs}
        for r in range(rounds):
            for key, (fw, k, (make, getter, _), interval) in runs.items():
                if args.budget_s and time.perf_counter() - started > args.budget_s:
                    log(f"budget spent: {key} round {r + 1} skipped")
                    continue
                default_interval = sys.getswitchinterval()
                if interval:
                    sys.setswitchinterval(interval)
                it = make()
                try:
                    results[key].append(run_loop(fw, getter(it), k, steps, 0.2 if quick else 2.0))
                finally:
                    close(it)
                    sys.setswitchinterval(default_interval)
                log(f"{pname} {key} round {r + 1}: {100 * results[key][-1].share:.2f}% waiting")
        for key, rs in results.items():
            if not rs:
                continue
            fw, k, (_, _, where), _ = runs[key]
            waits = np.array([w for r in rs for w in r.waits_ms])
            p50, p99 = np.percentile(waits, [50, 99])
            rows.append(
                [
                    pname,
                    key[0],
                    key[1],
                    f"{100 * statistics.median(r.share for r in rs):.2f}%",
                    f"{statistics.median(r.wait_ms for r in rs):.2f}",
                    f"{p50:.2f}/{p99:.2f}/{waits.max():.1f}",
                    f"{statistics.median(r.step_ms for r in rs):.1f}",
                    f"{statistics.median(r.h2d_mb_s for r in rs):,.0f}",
                    where,
                ]
            )
            threads_seen.append(f"#   {pname} {key[0]} {key[1]}: {rs[-1].threads}")
        write()
    write()
    print(args.out.read_text(), end="")
    log(f"done in {time.perf_counter() - started:.0f} s")
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
