"""Worker processes: chute's `mp_prefetch` beside Grain 0.2.18's, in one run.

Sections (each prints one table; all results also go to bench_out/bench_mp.json):

- `text`: seed 003's pipeline on the shared corpus (120k records, ArrayRecord written with
  `group_size:1`): parse JSON, tokenize (bert-base-uncased, `tokenizers`), shuffle(42),
  repeat, shard [1::16], trim to 128, pad to 128, batch 512. rows/s after the first batch
  (from each worker), for 0 workers with ReadOptions num_threads 0 and 2 and for
  `mp_prefetch` with 2 workers; each library's best against the other's. A first-fit
  packed variant is added when `chute.experimental.FirstFitPackIterDataset` exists.
- `transfer`: 16 MiB float32 arrays through `mp_prefetch` with 1 and 2 workers, GB/s at
  the consumer (which reads one element of each array): a map that makes a 16 MiB array
  per element, a map that returns one existing 16 MiB array (the handing-over alone), and
  a map making 1 MiB rows that the MapDataset batches by 16 (the batch is made in the
  workers), and the first map written with `chute.multiprocessing.empty` + `fill` (the
  same code runs in both libraries; only in chute's workers is that memory shared).
- `scaling`: a CPU-bound pure-Python map, 0 workers against `mp_prefetch` with 2 workers.
- `ttfb`: time to the first batch of a fresh iterator, worker start-up included, with 2
  and 8 workers, on the text pipeline and on a trivial one. Each measurement runs in a
  fresh Python process: "cold" is its first iterator (for chute that includes starting
  the forkserver), "warm" a second one in the same process.
- `waiting`: seed 003's "waiting for data" loops scaled down 10x (a 0.1 s train step, a
  0.5 s model restore, 50 steps) on the text pipeline with 0 workers and a batch size
  that makes one batch take about 40% of a step: synchronous, with
  `experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=3)`, and with that
  plus `it.start_prefetch()` before the restore; % of time waiting exactly as the seed's
  `train` and `train_from_checkpoint` compute it.
- `memory`: a 2,000,000-element Python list as the source, a map reading each element,
  `mp_prefetch` with 2 workers, all elements iterated: USS/RSS of each worker process
  after the first batch and at the end (and torch's DataLoader, if torch is installed).

Contenders run interleaved round by round and the best round counts: on a shared
machine compare the ratios within one run, not the absolute figures.

    .venv/bin/python benchmarks/bench_mp.py                 # everything, ~6 minutes
    .venv/bin/python benchmarks/bench_mp.py --quick         # small sizes, a smoke run
    .venv/bin/python benchmarks/bench_mp.py --only ttfb     # one section (repeatable)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chute
from _corpus import OUT, Tokenize, corpus_array_record, tokenizer_path
from _harness import machine, table

SEQ_LEN = 128
BATCH = 512
CORPUS_RECORDS = 120_000
SECTIONS = ("text", "transfer", "scaling", "ttfb", "waiting", "memory")
MiB = 1 << 20


def lib_module(name: str) -> Any:
    if name == "chute":
        return chute
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()  # as seed 003 does: grain reads absl flags
    return grain


def mp_options(g: Any, workers: int) -> Any:
    if g is chute:
        return chute.MultiprocessingOptions(num_workers=workers)
    return g.multiprocessing.MultiprocessingOptions(num_workers=workers)


def close(it: Any) -> None:
    closer = getattr(it, "close", None)
    if closer is not None:
        closer()


# -- pipeline functions: module level, so that worker processes can unpickle them ----------


def trim_values(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"description": element["description"][:SEQ_LEN]}


def pad_values(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens = element["description"]
    padded = np.zeros(SEQ_LEN, dtype=np.int32)
    padded[: len(tokens)] = tokens
    return {"description": padded}


def big_array(i: int) -> np.ndarray:
    return np.full((4096, 1024), i, dtype=np.float32)  # 16 MiB


_READY = np.ones((4096, 1024), dtype=np.float32)


def ready_array(i: int) -> np.ndarray:
    """An existing 16 MiB array: isolates the handing-over from making the array."""
    return _READY


def spin(i: int) -> int:
    """~2,000 pure-Python arithmetic operations: holds the GIL throughout."""
    x = i
    for _ in range(2000):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def read_item(item: tuple[int, str]) -> int:
    return item[0] + len(item[1])


def identity(x: Any) -> Any:
    return x


# -- pipelines -----------------------------------------------------------------------------


def text_pipeline(
    lib: str,
    *,
    threads: int = 0,
    workers: int = 0,
    batch_size: int = BATCH,
    packed: bool = False,
    records: int = CORPUS_RECORDS,
) -> Any:
    """Seed 003's pipeline; padded to 128 before `batch` (or first-fit packed)."""
    g = lib_module(lib)
    path = str(corpus_array_record(records))
    ds = (
        g.MapDataset.source(g.sources.ArrayRecordDataSource(path))
        .map(json.loads)
        .map(Tokenize(str(tokenizer_path())))
        .shuffle(seed=42)
        .repeat(num_epochs=100)[1::16]
        .map(trim_values)
    )
    if not packed:
        ds = ds.map(pad_values)
    it_ds = ds.to_iter_dataset(g.ReadOptions(num_threads=threads))
    if packed:
        it_ds = g.experimental.FirstFitPackIterDataset(
            it_ds, length_struct={"description": SEQ_LEN}, num_packing_bins=30
        )
    it_ds = it_ds.batch(batch_size, drop_remainder=True)
    if workers:
        it_ds = it_ds.mp_prefetch(mp_options(g, workers))
    return it_ds


def trivial_pipeline(lib: str, workers: int) -> Any:
    g = lib_module(lib)
    ds = g.MapDataset.range(1_000_000).map(identity).to_iter_dataset(g.ReadOptions(num_threads=0))
    ds = ds.batch(BATCH, drop_remainder=True)
    return ds.mp_prefetch(mp_options(g, workers)) if workers else ds


def big_array_shared(i: int) -> np.ndarray:
    """`big_array` made in `chute.multiprocessing.empty`: in a chute worker, its slab; in
    any other process (Grain's workers too) it is `np.empty`."""
    out = chute.multiprocessing.empty((4096, 1024), np.float32)
    out.fill(i)
    return out


def big_row(i: int) -> np.ndarray:
    return np.full((256, 1024), i, dtype=np.float32)  # 1 MiB; 16 of them make a batch


def transfer_pipeline(lib: str, workers: int, variant: str = "made") -> Any:
    """`variant`: "made" (a map makes a 16 MiB array per element), "shared" (the same, in
    `chute.multiprocessing.empty`), "existing" (a map returns one existing 16 MiB array)
    or "batched" (16 rows of 1 MiB, batched in the workers into one 16 MiB array)."""
    g = lib_module(lib)
    if variant == "batched":
        ds = g.MapDataset.range(1_000_000).map(big_row).batch(16)
    else:
        fns = {"made": big_array, "shared": big_array_shared, "existing": ready_array}
        ds = g.MapDataset.range(1_000_000).map(fns[variant])
    ds = ds.to_iter_dataset(g.ReadOptions(num_threads=0))
    return ds.mp_prefetch(mp_options(g, workers))


def spin_pipeline(lib: str, workers: int, n: int) -> Any:
    g = lib_module(lib)
    ds = g.MapDataset.range(n).map(spin).to_iter_dataset(g.ReadOptions(num_threads=0))
    ds = ds.batch(64)
    return ds.mp_prefetch(mp_options(g, workers)) if workers else ds


# -- timing --------------------------------------------------------------------------------


def timed_after_first(
    ds: Any, min_s: float, max_n: int, touch: Callable[[Any], Any], skip: int = 1
) -> tuple:
    """Fresh iterator; the first `skip` elements are not timed (one per worker, so that
    every worker has started: Grain's reach the consumer round-robin, seconds apart); then
    elements until `min_s` seconds or `max_n` elements have passed. (elements, seconds)"""
    it = iter(ds)
    try:
        for _ in range(skip):
            touch(next(it))
        n = 0
        t0 = time.perf_counter()
        while True:
            touch(next(it))
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_s or n >= max_n:
                return n, elapsed
    finally:
        close(it)


def best_of_rounds(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Best rate of each run, the runs interleaved round by round (as `_harness.rates`)."""
    best = dict.fromkeys(runs, 0.0)
    for _ in range(rounds):
        for name, run in runs.items():
            best[name] = max(best[name], run())
    return best


# -- 1. text pipeline throughput -----------------------------------------------------------

TEXT_CONFIGS = {
    "0 workers, 0 threads": {"threads": 0, "workers": 0},
    "0 workers, 2 threads": {"threads": 2, "workers": 0},
    "mp_prefetch, 2 workers": {"threads": 0, "workers": 2},
}


def section_text(cfg: argparse.Namespace) -> dict[str, Any]:
    packed = hasattr(chute.experimental, "FirstFitPackIterDataset")
    variants = [False, True] if packed else [False]

    def run(lib: str, packing: bool, conf: dict[str, int]) -> Callable[[], float]:
        def go() -> float:
            ds = text_pipeline(lib, packed=packing, **conf)
            skip = max(1, conf["workers"])
            n, s = timed_after_first(ds, cfg.text_seconds, 400, lambda b: None, skip)
            return n * BATCH / s

        return go

    runs = {
        (lib, packing, name): run(lib, packing, conf)
        for packing in variants
        for name, conf in TEXT_CONFIGS.items()
        for lib in ("chute", "grain")
    }
    best = best_of_rounds(runs, cfg.rounds)  # type: ignore[arg-type]
    rows, out = [], {}
    for packing in variants:
        label = "packed" if packing else "padded"
        for name in TEXT_CONFIGS:
            c, g = best[("chute", packing, name)], best[("grain", packing, name)]
            rows.append([label, name, f"{c:,.0f}", f"{g:,.0f}", f"{c / g:.1f}x"])
            out[f"{label}: {name}"] = {"chute": c, "grain": g}
        cb = max(TEXT_CONFIGS, key=lambda k: best[("chute", packing, k)])
        gb = max(TEXT_CONFIGS, key=lambda k: best[("grain", packing, k)])
        c, g = best[("chute", packing, cb)], best[("grain", packing, gb)]
        rows.append(
            [label, f"BEST: chute {cb} / grain {gb}", f"{c:,.0f}", f"{g:,.0f}", f"{c / g:.1f}x"]
        )
        out[f"{label}: best"] = {
            "chute_config": cb,
            "grain_config": gb,
            "chute": c,
            "grain": g,
            "ratio": c / g,
        }
    print(
        f"\n## 1. seed 003's pipeline, batch {BATCH}, rows/s after the first batch from each "
        f"worker (best of {cfg.rounds} rounds, >= {cfg.text_seconds:g} s each)"
    )
    print(table(["variant", "configuration", "chute rows/s", "grain rows/s", "chute/grain"], rows))
    if not packed:
        print("(chute.experimental.FirstFitPackIterDataset does not exist yet: no packed variant)")
    return out


# -- 2. moving 16 MiB arrays ---------------------------------------------------------------


def transfer_run(lib: str, workers: int, min_s: float, variant: str) -> tuple[float, float]:
    """GB/s after a first array from each worker, and the longest wait for one array (s)."""
    it = iter(transfer_pipeline(lib, workers, variant))
    try:
        for _ in range(workers):  # a first array from every worker
            next(it)[0, 0]
        n, longest = 0, 0.0
        t0 = last = time.perf_counter()
        while True:
            next(it)[0, 0]  # touch one element; the array is dropped at once
            n += 1
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
            if now - t0 >= min_s or n >= 1000:
                return n * 16 * MiB / (now - t0) / 1e9, longest
    finally:
        close(it)


def section_transfer(cfg: argparse.Namespace) -> dict[str, Any]:
    longest: dict[tuple[str, int], float] = {}

    def run(lib: str, workers: int, variant: str) -> Callable[[], float]:
        def go() -> float:
            rate, gap = transfer_run(lib, workers, cfg.transfer_seconds, variant)
            key = (lib, workers, variant)
            longest[key] = max(longest.get(key, 0.0), gap)  # type: ignore[index]
            return rate

        return go

    variants = (
        ("made", "made per element"),
        ("existing", "existing array"),
        ("batched", "16 x 1 MiB, batched"),
        ("shared", "made in mp.empty"),
    )
    runs = {
        (lib, w, variant): run(lib, w, variant)
        for variant, _ in variants
        for w in (1, 2)
        for lib in ("chute", "grain")
    }
    best = best_of_rounds(runs, cfg.rounds)  # type: ignore[arg-type]
    rows, out = [], {}
    for variant, label in variants:
        for w in (1, 2):
            c, g = best[("chute", w, variant)], best[("grain", w, variant)]
            lc = longest[("chute", w, variant)]  # type: ignore[index]
            lg = longest[("grain", w, variant)]  # type: ignore[index]
            rows.append(
                [label, str(w), f"{c:.2f}", f"{g:.2f}", f"{c / g:.1f}x", f"{lc * 1e3:,.0f}",
                 f"{lg * 1e3:,.0f}"]
            )  # fmt: skip
            out[f"{label}, {w} workers"] = {
                "chute_GBps": c,
                "grain_GBps": g,
                "ratio": c / g,
                "chute_longest_wait_s": lc,
                "grain_longest_wait_s": lg,
            }
    print(
        f"\n## 2. 16 MiB float32 arrays from workers to the consumer, GB/s after the first "
        f"from each worker (best of {cfg.rounds}, >= {cfg.transfer_seconds:g} s each; longest "
        "wait for one array over all rounds)"
    )
    print(
        table(
            [
                "array",
                "workers",
                "chute GB/s",
                "grain GB/s",
                "chute/grain",
                "chute longest ms",
                "grain longest ms",
            ],
            rows,
        )
    )
    return out


# -- 3. scaling a CPU-bound map ------------------------------------------------------------


def section_scaling(cfg: argparse.Namespace) -> dict[str, Any]:
    n = cfg.spin_n

    runs = {(lib, w): _run_to_end(lib, w, n) for lib in ("chute", "grain") for w in (0, 2)}
    # spawn: this process may have threads by now, which makes fork unsafe
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(spin, range(2))  # started
        runs[("pool", 0)] = _pool_run(None, n)
        runs[("pool", 2)] = _pool_run(pool, n)
        best = best_of_rounds(runs, cfg.rounds)  # type: ignore[arg-type]
    rows, out = [], {}
    for lib in ("chute", "grain", "pool"):
        s0, s2 = best[(lib, 0)], best[(lib, 2)]
        name = "bare loop / multiprocessing.Pool" if lib == "pool" else lib
        rows.append([name, f"{s0:,.0f}", f"{s2:,.0f}", f"{s2 / s0:.2f}x"])
        out[lib] = {"0_workers": s0, "2_workers": s2, "speedup": s2 / s0}
    print(
        f"\n## 3. CPU-bound pure-Python map (~2,000 ops/element, {n:,} elements, batch 64), "
        f"elements/s after the first batch from each worker (best of {cfg.rounds}); the last "
        "row is what this machine allows: a bare loop against a started Pool(2).map(chunksize=64)"
    )
    print(table(["library", "0 workers", "mp_prefetch 2 workers", "speedup"], rows))
    return out


def _pool_run(pool: Any, n: int) -> Callable[[], float]:
    def go() -> float:
        t0 = time.perf_counter()
        if pool is None:
            out = [spin(i) for i in range(n)]
        else:
            out = pool.map(spin, range(n), chunksize=64)
        assert len(out) == n
        return n / (time.perf_counter() - t0)

    return go


def _run_to_end(lib: str, workers: int, n: int) -> Callable[[], float]:
    def go() -> float:
        it = iter(spin_pipeline(lib, workers, n))
        try:
            for _ in range(max(1, workers)):  # a first batch from every worker
                next(it)
            count = 0
            t0 = time.perf_counter()
            for batch in it:
                count += len(batch)
            return count / (time.perf_counter() - t0)
        finally:
            close(it)

    return go


# -- 4. time to first batch ----------------------------------------------------------------


def ttfb_child(lib: str, pipeline: str, workers: int) -> None:
    """Runs in a fresh process: prints {"cold": s, "warm": s} as JSON."""
    g = lib_module(lib)
    del g  # imported before timing: the library's import is not worker start-up
    if pipeline == "text":
        corpus_array_record(CORPUS_RECORDS)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        ds = (
            text_pipeline(lib, workers=workers)
            if pipeline == "text"
            else trivial_pipeline(lib, workers)
        )
        it = iter(ds)
        next(it)
        times.append(time.perf_counter() - t0)
        close(it)
        del it
    print(json.dumps({"cold": times[0], "warm": times[1]}))


def section_ttfb(cfg: argparse.Namespace) -> dict[str, Any]:
    rows, out = [], {}
    for pipeline in ("text", "trivial"):
        for workers in cfg.ttfb_workers:
            res = {}
            for lib in ("chute", "grain"):
                cmd = [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--ttfb-child",
                    lib,
                    pipeline,
                    str(workers),
                ]
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if proc.returncode != 0:
                    raise RuntimeError(f"ttfb child {cmd} failed:\n{proc.stderr[-3000:]}")
                res[lib] = json.loads(proc.stdout.strip().splitlines()[-1])
            c, g = res["chute"], res["grain"]
            rows.append(
                [
                    "seed 003, batch 512" if pipeline == "text" else "range.map.batch(512)",
                    str(workers),
                    f"{c['cold']:.2f}",
                    f"{c['warm']:.2f}",
                    f"{g['cold']:.2f}",
                    f"{g['warm']:.2f}",
                    f"{g['cold'] / c['cold']:.1f}x",
                ]
            )
            out[f"{pipeline}, {workers} workers"] = res
    print(
        "\n## 4. time to first batch, s (fresh iterator, worker start-up included; fresh process)"
    )
    print(
        table(
            [
                "pipeline",
                "workers",
                "chute cold",
                "chute warm",
                "grain cold",
                "grain warm",
                "grain/chute cold",
            ],
            rows,
        )
    )
    return out


# -- 5. waiting for data (seed 003's train / train_from_checkpoint) ------------------------

TRAIN_STEP_S = 0.1
RESTORE_S = 0.5


def train(dataset: Any, num_steps: int) -> float:
    """Seed 003's `train`: % of time spent waiting for data."""
    it = iter(dataset)
    try:
        start_time = time.perf_counter()
        for _ in range(num_steps):
            data_batch = next(it)
            del data_batch
            time.sleep(TRAIN_STEP_S)
        training_time = time.perf_counter() - start_time
        return (training_time - num_steps * TRAIN_STEP_S) / training_time * 100
    finally:
        close(it)


def train_from_checkpoint(dataset: Any, num_steps: int) -> float:
    """Seed 003's `train_from_checkpoint`: prefetch starts before the model restore."""
    it = iter(dataset)
    try:
        it.start_prefetch()
        start_time = time.perf_counter()
        time.sleep(RESTORE_S)
        for _ in range(num_steps):
            data_batch = next(it)
            del data_batch
            time.sleep(TRAIN_STEP_S)
        training_time = time.perf_counter() - start_time
        return (training_time - num_steps * TRAIN_STEP_S - RESTORE_S) / training_time * 100
    finally:
        close(it)


def calibrate_batch(lib: str, fraction: float = 0.4) -> tuple[int, float]:
    """A batch size (multiple of 32) whose batch takes about `fraction` of a train step
    with 0 workers, timed as in the loop: each batch fetched after a step's sleep (on a
    busy machine that is slower than back to back). Returns (size, s per row)."""
    trial = 256
    it = iter(text_pipeline(lib, batch_size=trial))
    try:
        next(it)
        times = []
        for _ in range(7):
            time.sleep(TRAIN_STEP_S)
            t0 = time.perf_counter()
            next(it)
            times.append(time.perf_counter() - t0)
    finally:
        close(it)
    per_row = sorted(times)[len(times) // 2] / trial
    size = int(fraction * TRAIN_STEP_S / per_row / 32) * 32
    return max(32, min(size, 8192)), per_row


def first_batch_s(ds: Any) -> float:
    t0 = time.perf_counter()
    it = iter(ds)
    try:
        next(it)
        return time.perf_counter() - t0
    finally:
        close(it)


def section_waiting(cfg: argparse.Namespace) -> dict[str, Any]:
    rows, out = [], {}
    steps = cfg.steps
    for lib in ("chute", "grain"):
        g = lib_module(lib)
        size, per_row = calibrate_batch(lib)
        sync = text_pipeline(lib, batch_size=size)
        prefetched = g.experimental.ThreadPrefetchIterDataset(sync, prefetch_buffer_size=3)
        first = first_batch_s(prefetched)
        a = train(sync, steps)
        b = train(prefetched, steps)
        c = train_from_checkpoint(prefetched, steps)
        rows.append(
            [
                lib,
                str(size),
                f"{per_row * size * 1000:.0f}",
                f"{first * 1000:.0f}",
                f"{a:.2f}%",
                f"{b:.2f}%",
                f"{c:.2f}%",
            ]
        )
        out[lib] = {
            "batch_size": size,
            "batch_ms": per_row * size * 1000,
            "first_batch_ms": first * 1000,
            "sync": a,
            "prefetch": b,
            "prefetch_and_start": c,
        }
    print(
        f"\n## 5. % of time waiting for data: {steps} steps of {TRAIN_STEP_S} s, restore "
        f"{RESTORE_S} s, seed 003's pipeline with 0 workers, batch sized to take ~40% of a "
        "step (seed's figures: 46.24%, 1.60%, 0.48%; '1st batch': a fresh prefetching "
        "iterator's first batch, which (b) waits for in full)"
    )
    print(
        table(
            [
                "library",
                "batch",
                "ms/batch",
                "1st batch ms",
                "(a) sync",
                "(b) ThreadPrefetch(3)",
                "(c) + start_prefetch",
            ],
            rows,
        )
    )
    return out


# -- 6. memory of workers iterating over a big in-memory list ------------------------------


def make_list(n: int) -> list[tuple[int, str]]:
    return [(i, f"record number {i:09d}") for i in range(n)]


def _procs() -> dict[int, Any]:
    import psutil

    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def _workers(before: set[int]) -> list[Any]:
    """Processes started since `before`: the workers, not the forkserver nor the tracker."""
    import psutil

    found = []
    procs = _procs()
    for pid, p in procs.items():
        if pid in before:
            continue
        try:
            cmd = " ".join(p.cmdline())
            has_children = bool(p.children())
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or ("forkserver" in cmd and p.ppid() == os.getpid()):
            continue
        if has_children and "forkserver" in cmd:
            continue
        found.append(p)
    return found


class _Sampler:
    """Samples (USS, RSS) MiB of each process every `interval` s in a thread. A process
    that has exited keeps its last sample: Grain's and torch's workers exit when their
    share is done, so their "end" is the last sample before that (at most `interval` old).
    """

    def __init__(self, procs: list[Any], interval: float = 0.1) -> None:
        self.procs = procs
        self.interval = interval
        self.last: list[tuple[float, float]] = [(0.0, 0.0)] * len(procs)
        self.peak = [0.0] * len(procs)
        self.sample()
        self.start = list(self.last)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        import psutil

        for k, p in enumerate(self.procs):
            try:
                info = p.memory_full_info()
            except psutil.Error:
                continue
            self.last[k] = (info.uss / MiB, info.rss / MiB)
            self.peak[k] = max(self.peak[k], info.uss / MiB)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def measure_memory(make_iter: Callable[[], Any], n: int) -> dict[str, Any]:
    """Iterates over all `n` elements. "start" is sampled when the first batch arrives,
    "end" when 97% of the elements have arrived (Grain's and torch's workers exit, freeing
    memory, once their share is done, so a sample after the last batch would measure
    their teardown); the peak is sampled every 0.1 s throughout."""
    before = set(_procs())
    t0 = time.perf_counter()
    it = make_iter()
    count = 0
    sampler = None
    end: list[tuple[float, float]] | None = None
    try:
        first = next(it)
        count += len(first)
        workers = _workers(before)
        sampler = _Sampler(workers)
        for batch in it:
            count += len(batch)
            if end is None and count >= 0.97 * n:
                sampler.sample()
                end = list(sampler.last)
    finally:
        if sampler is not None:
            sampler.stop()
        close(it)
    assert end is not None, f"only {count} of {n} elements arrived"
    k = max(1, len(workers))
    start = sampler.start
    return {
        "workers_found": len(workers),
        "elements": count,
        "seconds": time.perf_counter() - t0,
        "uss_start_mb": sum(u for u, _ in start) / k,
        "uss_end_mb": sum(u for u, _ in end) / k,
        "uss_peak_mb": sum(sampler.peak) / k,
        "rss_start_mb": sum(r for _, r in start) / k,
        "rss_end_mb": sum(r for _, r in end) / k,
    }


def section_memory(cfg: argparse.Namespace) -> dict[str, Any]:
    import psutil

    n = cfg.memory_n
    rss0 = psutil.Process().memory_info().rss
    items = make_list(n)
    main_mb = (psutil.Process().memory_info().rss - rss0) / MiB
    batch = 1024

    def dataset_iter(lib: str) -> Callable[[], Any]:
        def make() -> Any:
            g = lib_module(lib)
            ds = (
                g.MapDataset.source(items)
                .map(read_item)
                .to_iter_dataset(g.ReadOptions(num_threads=0))
            )
            return iter(ds.batch(batch, drop_remainder=True).mp_prefetch(mp_options(g, 2)))

        return make

    results: dict[str, Any] = {}
    for lib in ("chute", "grain"):
        results[lib] = measure_memory(dataset_iter(lib), n)
    try:
        import torch  # noqa: F401
    except ImportError:
        results["torch"] = None
    else:
        results["torch"] = measure_memory(lambda: iter(torch_loader(items, batch)), n)
    rows = []
    for lib, r in results.items():
        if r is None:
            rows.append([f"{lib} DataLoader", "not installed", "", "", "", "", "", "", "", ""])
            continue
        rows.append(
            [
                lib if lib != "torch" else "torch DataLoader (fork)",
                str(r["workers_found"]),
                f"{r['elements']:,}",
                f"{r['uss_start_mb']:,.0f}",
                f"{r['uss_end_mb']:,.0f}",
                f"{r['uss_peak_mb']:,.0f}",
                f"{r['uss_end_mb'] - r['uss_start_mb']:+,.0f}",
                f"{r['rss_start_mb']:,.0f}",
                f"{r['rss_end_mb'] - r['rss_start_mb']:+,.0f}",
                f"{r['seconds']:.1f}",
            ]
        )
    print(
        f"\n## 6. memory per worker, MiB: a list of {n:,} (int, str) tuples as the source "
        f"(it adds {main_mb:,.0f} MiB to the main process's RSS), map reading each, 2 workers, "
        f"batch {batch}"
    )
    print(
        table(
            [
                "library",
                "workers",
                "elements",
                "USS start",
                "USS end",
                "USS peak",
                "USS growth",
                "RSS start",
                "RSS growth",
                "s",
            ],
            rows,
        )
    )
    return {"elements": n, "list_rss_mb": main_mb, **results}


def torch_loader(items: list[tuple[int, str]], batch: int) -> Any:
    import torch.utils.data

    class ListDataset(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(items)

        def __getitem__(self, i: int) -> int:
            return read_item(items[i])

    return torch.utils.data.DataLoader(
        ListDataset(), batch_size=batch, num_workers=2, drop_last=True
    )


# -- main ----------------------------------------------------------------------------------


def targets(results: dict[str, Any]) -> list[list[str]]:
    rows = []

    def add(name: str, value: float, ok: bool, fmt: str) -> None:
        rows.append([name, fmt.format(value), "yes" if ok else "NO"])

    if "text" in results:
        # The pipeline packs with first-fit once it exists (it does); padding was
        # its stand-in until then, and is reported too.
        r = results["text"]["packed: best"]["ratio"]
        add("1. text (first-fit packed), chute best / grain best >= 5x", r, r >= 5, "{:.1f}x")
        r = results["text"]["padded: best"]["ratio"]
        add("1'. text (padded stand-in), chute best / grain best", r, r >= 5, "{:.1f}x")
    if "transfer" in results:
        t = results["transfer"]
        best_c = max(v["chute_GBps"] for v in t.values())
        add("2. 16 MiB arrays, chute >= 5 GB/s", best_c, best_c >= 5, "{:.2f} GB/s")
        for label in (
            "made per element",
            "existing array",
            "16 x 1 MiB, batched",
            "made in mp.empty",
        ):
            ratios = [v["ratio"] for k, v in t.items() if k.startswith(label)]
            if ratios:
                add(
                    f"2. 16 MiB arrays ({label}), chute/grain >= 10x (each worker count)",
                    min(ratios),
                    min(ratios) >= 10,
                    "{:.1f}x",
                )
    if "scaling" in results:
        for lib in ("chute", "grain"):
            s = results["scaling"][lib]["speedup"]
            add(f"3. scaling {lib}, 2 workers / 0 workers >= 1.7x", s, s >= 1.7, "{:.2f}x")
    if "waiting" in results:
        for lib in ("chute", "grain"):
            w = results["waiting"][lib]
            add(f"5. waiting {lib} (b) <= 1.6%", w["prefetch"], w["prefetch"] <= 1.6, "{:.2f}%")
            add(
                f"5. waiting {lib} (c) <= 0.48%",
                w["prefetch_and_start"],
                w["prefetch_and_start"] <= 0.48,
                "{:.2f}%",
            )
    return rows


def revision() -> str:
    """The checkout's commit, and whether the work tree has changes."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "unknown"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--only", action="append", choices=SECTIONS, help="run only this section")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument(
        "--ttfb-child", nargs=3, metavar=("LIB", "PIPELINE", "WORKERS"), help=argparse.SUPPRESS
    )
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    if args.ttfb_child:
        lib, pipeline, workers = args.ttfb_child
        ttfb_child(lib, pipeline, int(workers))
        return
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 3)
    args.text_seconds = 0.5 if quick else 1.5
    args.transfer_seconds = 0.5 if quick else 1.5
    args.spin_n = 2_000 if quick else 12_000
    args.ttfb_workers = (2, 8)
    args.steps = 10 if quick else 50
    args.memory_n = 200_000 if quick else 2_000_000
    sections = args.only or list(SECTIONS)

    print(
        f"# bench_mp{' --quick' if quick else ''}: chute vs grain, worker processes\n# {machine()}"
    )
    print(f"# chute checkout: {revision()}")
    corpus_array_record(CORPUS_RECORDS)
    Tokenize(str(tokenizer_path()))({"description": "warm up"})  # the notebook loads it once
    out_path = OUT / "bench_mp.json"
    saved: dict[str, Any] = {}
    if out_path.exists():
        try:
            saved = json.loads(out_path.read_text())
        except ValueError:
            saved = {}
    results: dict[str, Any] = {}
    t_start = time.perf_counter()
    fns = {
        "text": section_text,
        "transfer": section_transfer,
        "scaling": section_scaling,
        "ttfb": section_ttfb,
        "waiting": section_waiting,
        "memory": section_memory,
    }
    for name in SECTIONS:
        if name in sections:
            t0 = time.perf_counter()
            results[name] = fns[name](args)
            print(f"({time.perf_counter() - t0:.0f} s)")
            saved[name] = {
                "quick": quick,
                "machine": machine(),
                "when": time.time(),
                **results[name],
            }
            OUT.mkdir(exist_ok=True)
            out_path.write_text(json.dumps(saved, indent=1, default=float))
    rows = targets(results)
    if rows:
        print("\n## targets")
        print(table(["target", "value", "met"], rows))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s; results in {out_path}")


if __name__ == "__main__":
    main()
