"""chute.AUTOTUNE against the best hand-picked setting, and tf.data's AUTOTUNE, on three kinds
of pipeline.

- `text (CPU-bound Python)`: seed 003's pipeline on the shared corpus in ArrayRecord:
  parse JSON, tokenize (bert-base-uncased with `tokenizers`), shuffle(42), repeat, shard 1
  of 16, trim and pad to 128, batch 512. Rows/s.
- `reads (latency-bound)`: a source whose every read sleeps 2 to 20 ms (a fixed
  pseudo-random time per record, as object storage answers) and returns 1 KiB; batch 32.
  Records/s.
- `image (numpy-heavy)`: JPEG decode with Pillow, random 224 crop and flip (numpy), batch
  64 (`bench_image.py`'s work; synthetic pictures of the same sizes when scikit-image and
  matplotlib are missing). Images/s.
- `interleave (latency-bound)`: 64 small JSON Lines shards (100 lines of ~200 bytes each)
  read through `bench_streams.py`'s reader, which sleeps `--latency-ms` (20) at each file
  open and each 64 KiB read, as remote storage answers; the list of shards repeated so the
  run does not end; `InterleaveIterDataset(cycle_length=16)`, batch 256 lines. Chute's
  contenders are interleave `parallelism` values with the inputs opened ahead
  (`make_iter_buffer_size`) that keep those threads busy (17 threads and 1 ahead is the
  fixed default before AUTOTUNE: one thread per open input and one opened ahead) and
  AUTOTUNE; tf.data:
  `interleave(from_generator(reader), cycle_length=16, num_parallel_calls=AUTOTUNE)
  .batch(256).prefetch(AUTOTUNE)`. Lines/s.

chute settings: `ReadOptions(num_threads=N)` for each N of a sweep (prefetch_buffer_size
500, Grain's default), `ReadOptions()` (both AUTOTUNE, the default); for the text pipeline
also `mp_prefetch` with 1 and 2 workers and `mp_prefetch()` (AUTOTUNE workers).
tf.data: `Dataset.range(n).map(tf.numpy_function(work), num_parallel_calls=AUTOTUNE)
.batch(b).prefetch(AUTOTUNE)`: the same Python function per element.

Each run: a fresh iterator, `--tune-s` seconds not timed (AUTOTUNE climbs meanwhile; the
fixed settings get the same), then the rate over `--measure-s` seconds. AUTOTUNE's rate
over the whole run (tuning included) is shown too. Rounds alternate every contender;
medians of the rounds.

    python benchmarks/bench_autotune.py [--rounds 3] [--tune-s 2.5] [--measure-s 3]
        [--only text|reads|image|interleave] [--latency-ms 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chute
from _corpus import Tokenize, corpus_array_record, tokenizer_path
from _harness import machine, table
from bench_rampup import images
from bench_streams import SlowLines

SEQ_LEN = 128
RECORDS = 120_000


# -- the work (module level: worker processes unpickle it) ---------------------------------


def pad(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens = element["description"][:SEQ_LEN]
    out = np.zeros(SEQ_LEN, dtype=np.int32)
    out[: len(tokens)] = tokens
    return {"description": out}


def read_delay_s(i: int) -> float:
    """2 to 20 ms, fixed per record."""
    return 0.002 + (zlib.crc32(int(i).to_bytes(8, "little")) % 19) / 1000


class SlowStore:
    """A random-access source whose reads wait as object storage does."""

    def __len__(self) -> int:
        return 10_000_000

    def __getitem__(self, i: int) -> bytes:
        time.sleep(read_delay_s(i))
        return int(i).to_bytes(8, "little") * 128  # 1 KiB


def slow_read(i: Any) -> np.ndarray:
    time.sleep(read_delay_s(int(i)))
    return np.frombuffer(int(i).to_bytes(8, "little") * 128, np.uint8)


def to_array(record: bytes) -> np.ndarray:
    return np.frombuffer(record, np.uint8)


# -- pipelines -----------------------------------------------------------------------------


def chute_text(options: chute.ReadOptions, workers: int | str | None = None) -> Any:
    ds = (
        chute.MapDataset.source(
            chute.sources.ArrayRecordDataSource(str(corpus_array_record(RECORDS)))
        )
        .map(json.loads)
        .map(Tokenize(str(tokenizer_path())))
        .shuffle(seed=42)
        .repeat(num_epochs=100)[1::16]
        .map(pad)
        .to_iter_dataset(options)
        .batch(512, drop_remainder=True)
    )
    if workers == "auto":
        return ds.mp_prefetch()
    if workers:
        return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=int(workers)))
    return ds


def chute_reads(options: chute.ReadOptions) -> Any:
    return (
        chute.MapDataset.source(SlowStore())
        .map(to_array)
        .to_iter_dataset(options)
        .batch(32, drop_remainder=True)
    )


SHARDS, SHARD_LINES, REPEATS, CYCLE = 64, 100, 200, 16


def shard_files() -> list[str]:
    """64 JSON Lines files of 100 lines each, made once in bench_out/interleave_shards/."""
    from _corpus import OUT

    folder = OUT / "interleave_shards"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(SHARDS):
        path = folder / f"shard-{k:03d}.jsonl"
        if not path.exists():
            lines = (
                json.dumps({"id": k * SHARD_LINES + i, "text": "lorem ipsum " * 14})
                for i in range(SHARD_LINES)
            )
            path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def chute_interleave(parallelism: Any, latency: float, ahead: int = 1) -> Any:
    shards = [chute.IterDataset.source(SlowLines(p, latency)) for p in shard_files()]
    return chute.experimental.InterleaveIterDataset(
        shards * REPEATS,
        cycle_length=CYCLE,
        parallelism=parallelism,
        make_iter_buffer_size=ahead,
    ).batch(256, drop_remainder=True)


def tf_interleave(latency: float) -> Iterator[Any]:
    import tensorflow as tf

    def open_file(path: Any) -> Any:
        return tf.data.Dataset.from_generator(
            lambda p: SlowLines(p.decode(), latency)(),
            args=(path,),
            output_signature=tf.TensorSpec((), tf.string),
        )

    files = tf.data.Dataset.from_tensor_slices(shard_files() * REPEATS)
    ds = files.interleave(open_file, cycle_length=CYCLE, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(256, drop_remainder=True).prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def chute_images(options: chute.ReadOptions, paths: list[str]) -> Any:
    import bench_image

    return (
        chute.MapDataset.source(paths)
        .shuffle(seed=7)
        .repeat()
        .random_map(bench_image.load_and_augment, seed=3)
        .to_iter_dataset(options)
        .batch(64, drop_remainder=True)
    )


class TextWork:
    """Record i of the corpus, parsed, tokenized, padded: for tf.numpy_function."""

    def __init__(self) -> None:
        from array_record.python.array_record_data_source import ArrayRecordDataSource

        self.source = ArrayRecordDataSource(str(corpus_array_record(RECORDS)))
        self.tokenize = Tokenize(str(tokenizer_path()))
        self.order = np.random.default_rng(42).permutation(len(self.source))[1::16]

    def __call__(self, i: Any) -> np.ndarray:
        record = self.source[int(self.order[int(i) % len(self.order)])]
        return pad(self.tokenize(json.loads(record)))["description"]


def tf_pipeline(kind: str, paths: list[str]) -> Iterator[Any]:
    import tensorflow as tf

    if kind == "text":
        work: Callable[[Any], np.ndarray] = TextWork()
        out, shape, batch = tf.int32, (SEQ_LEN,), 512
    elif kind == "reads":
        work, out, shape, batch = slow_read, tf.uint8, (1024,), 32
    else:
        import bench_image

        def work(i: Any) -> np.ndarray:
            k = int(i)
            rng = np.random.default_rng([3, k])
            return bench_image.load_and_augment(paths[k % len(paths)], rng)

        out, shape, batch = tf.uint8, (224, 224, 3), 64

    def mapped(i: Any) -> Any:
        y = tf.numpy_function(work, [i], out)
        y.set_shape(shape)
        return y

    ds = (
        tf.data.Dataset.range(10_000_000)
        .map(mapped, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    return ds.as_numpy_iterator()


def rows(batch: Any) -> int:
    return len(batch["description"]) if isinstance(batch, dict) else len(batch)


def chosen(it: Any) -> str:
    """What AUTOTUNE holds now in `it`'s chain (walked with the public `children()`)."""
    found: dict[str, int] = {}
    stack = [it]
    while stack:
        node = stack.pop()
        tuning = getattr(node, "tuning", None)
        current = tuning() if callable(tuning) else None
        if current is not None:
            found.update(current.current)
        children = getattr(node, "children", None)
        stack.extend(children() if callable(children) else [])
    short = {
        "num_threads": "threads",
        "prefetch_buffer_size": "buffer",
        "inputs opened ahead": "ahead",
    }
    return ", ".join(f"{short.get(k, k)} {v}" for k, v in sorted(found.items()))


def run(make: Callable[[], Any], tune_s: float, measure_s: float) -> tuple[float, float, str]:
    """(rate over the measured window, rate over the whole run after the first batch, what
    AUTOTUNE chose)."""
    it = make()
    try:
        n0 = rows(next(it))
        del n0
        t0 = time.perf_counter()
        n_tune = 0
        while time.perf_counter() - t0 < tune_s:
            n_tune += rows(next(it))
        t1 = time.perf_counter()
        n = 0
        while time.perf_counter() - t1 < measure_s:
            n += rows(next(it))
        t2 = time.perf_counter()
        return n / (t2 - t1), (n + n_tune) / (t2 - t0), chosen(it)
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def contenders(
    paths: list[str], with_tf: bool, latency: float
) -> dict[str, dict[str, Callable[[], Any]]]:
    def fixed(n: int) -> chute.ReadOptions:
        return chute.ReadOptions(num_threads=n, prefetch_buffer_size=500)

    auto = chute.ReadOptions()
    out: dict[str, dict[str, Callable[[], Any]]] = {
        "text (CPU-bound Python), rows/s": {
            **{f"{n} threads": (lambda n=n: iter(chute_text(fixed(n)))) for n in (0, 1, 2, 4, 16)},
            "1 worker": lambda: iter(chute_text(fixed(0), 1)),
            "2 workers": lambda: iter(chute_text(fixed(0), 2)),
            "AUTOTUNE threads": lambda: iter(chute_text(auto)),
            "AUTOTUNE workers": lambda: iter(chute_text(auto, "auto")),
        },
        "reads (2-20 ms each), records/s": {
            **{f"{n} threads": (lambda n=n: iter(chute_reads(fixed(n)))) for n in (0, 4, 16, 64)},
            "AUTOTUNE threads": lambda: iter(chute_reads(auto)),
        },
        "image (numpy-heavy), images/s": {
            **{
                f"{n} threads": (lambda n=n: iter(chute_images(fixed(n), paths)))
                for n in (0, 1, 2, 4, 16)
            },
            "AUTOTUNE threads": lambda: iter(chute_images(auto, paths)),
        },
        "interleave (latency-bound), lines/s": {
            **{
                f"parallelism {n}, {a} ahead": (
                    lambda n=n, a=a: iter(chute_interleave(n, latency, a))
                )
                for n, a in ((4, 1), (17, 1), (32, 16), (64, 48))
            },
            "AUTOTUNE parallelism": lambda: iter(chute_interleave(chute.AUTOTUNE, latency)),
        },
    }
    if with_tf:
        for runs, kind in zip(out.values(), ("text", "reads", "image", "interleave")):
            if kind == "interleave":
                runs["tf.data AUTOTUNE"] = lambda: tf_interleave(latency)
            else:
                runs["tf.data AUTOTUNE"] = lambda kind=kind: tf_pipeline(kind, paths)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tune-s", type=float, default=2.5)
    parser.add_argument("--measure-s", type=float, default=3.0)
    parser.add_argument("--no-tf", action="store_true")
    parser.add_argument("--only", choices=("text", "reads", "image", "interleave"), action="append")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="for interleave")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with_tf = not args.no_tf
    if with_tf:
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            with_tf = False
            print("(tensorflow not installed: no tf.data column; pip install -e '.[bench]')")
    paths = images()
    corpus_array_record(RECORDS)
    print(f"# bench_autotune\n# {machine()}")
    print(
        f"# rates after {args.tune_s} s of tuning, over {args.measure_s} s; medians of "
        f"{args.rounds} rounds, every contender once per round"
    )
    pipelines = contenders(paths, with_tf, args.latency_ms / 1000)
    if args.only:
        pipelines = {k: v for k, v in pipelines.items() if k.split()[0] in args.only}
    measured: dict[str, dict[str, list[tuple[float, float, str]]]] = {}
    for _ in range(args.rounds):
        for pipeline, runs in pipelines.items():
            for name, make in runs.items():
                rate = run(make, args.tune_s, args.measure_s)
                measured.setdefault(pipeline, {}).setdefault(name, []).append(rate)
    summary_rows = []
    for pipeline, runs in measured.items():
        med = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
        whole = {name: statistics.median(r[1] for r in rs) for name, rs in runs.items()}
        hand = {n: v for n, v in med.items() if "AUTOTUNE" not in n}
        best_name = max(hand, key=hand.__getitem__)
        rows_out = []
        for name, value in med.items():
            rows_out.append(
                [
                    name,
                    f"{value:,.0f}",
                    f"{whole[name]:,.0f}",
                    f"{value / hand[best_name]:.2f}",
                    " ".join(f"{r[0]:,.0f}" for r in runs[name]),
                    " | ".join(r[2] for r in runs[name] if r[2]),
                ]
            )
        print(f"\n## {pipeline}")
        headers = ["setting", "rate", "incl. tuning", "/ best hand", "rounds", "AUTOTUNE chose"]
        print(table(headers, rows_out))
        for name in med:
            if name.startswith("AUTOTUNE"):
                summary_rows.append(
                    [
                        pipeline.split(",")[0],
                        name,
                        f"{med[name] / hand[best_name]:.2f}",
                        f"{whole[name] / hand[best_name]:.2f}",
                        best_name,
                        f"{med['tf.data AUTOTUNE'] / hand[best_name]:.2f}"
                        if "tf.data AUTOTUNE" in med
                        else "-",
                    ]
                )
    print("\n## AUTOTUNE / best hand-picked setting (target >= 0.9)")
    headers = ["pipeline", "chute", "ratio", "incl. tuning", "best hand-picked", "tf.data ratio"]
    print(table(headers, summary_rows))


if __name__ == "__main__":
    main()
