"""chute's main demo: a real text pipeline with throughput and an exact checkpoint/resume.

Builds the news-like corpus with shared/data/make_corpus.py (found beside the checkout, or
where $CHUTE_SHARED_DATA or --shared-data says) and writes it to chute's random-access
record format (`.crec`), then runs the text pipeline on it: parse JSON,
tokenize with the bert-base-uncased tokenizer, global shuffle, repeat, trim/pad to 128
tokens, batch, in worker processes. It prints time to first batch and throughput, saves the
iterator state mid-stream to a JSON file, restores it into a freshly built pipeline with a
different number of workers, and checks that the stream continues identically.

    python examples/demo.py            # 120,000 records, as the README runs it
    python examples/demo.py --records 2000 --batches 40
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import chute

SEQ_LEN = 128


def find_shared_data() -> Path:
    """The shared data directory: $CHUTE_SHARED_DATA, else `shared/data` beside the checkout."""
    env = os.environ.get("CHUTE_SHARED_DATA")
    if env:
        if not Path(env, "make_corpus.py").is_file():
            sys.exit(f"CHUTE_SHARED_DATA={env} has no make_corpus.py: point it at shared/data")
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    sys.exit(
        "shared/data not found beside the checkout: set CHUTE_SHARED_DATA to its path, "
        "or pass --shared-data PATH"
    )


class Tokenize(chute.MapTransform):
    """Tokenizes the description with the `tokenizers` package (picklable: loads lazily)."""

    def __init__(self, path: Path) -> None:
        self._path = str(path)
        self._tokenizer: Any = None

    def map(self, element: dict[str, Any]) -> dict[str, np.ndarray]:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(self._path)
        ids = self._tokenizer.encode(element["description"]).ids
        return {"description": np.asarray(ids, dtype=np.int32), "label": element["label"]}

    def __getstate__(self) -> dict[str, Any]:
        return {"_path": self._path, "_tokenizer": None}


def trim_and_pad(element: dict[str, Any]) -> dict[str, Any]:
    tokens = element["description"][:SEQ_LEN]
    padded = np.zeros(SEQ_LEN, dtype=np.int32)
    padded[: len(tokens)] = tokens
    return {"description": padded, "length": np.int32(len(tokens)), "label": element["label"]}


def build(source: Any, tokenizer: Path, batch_size: int, workers: int) -> Any:
    return (
        chute.MapDataset.source(source)
        .map(json.loads)
        .map(Tokenize(tokenizer))
        .shuffle(seed=42)
        .repeat(num_epochs=100)
        .map(trim_and_pad)
        .batch(batch_size, drop_remainder=True)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    )


def write_crec(corpus: Path, out: Path) -> None:
    """The corpus as a `.crec` file, one JSON record each (what `chute convert` does)."""
    with chute.records.RecordWriter(out) as writer, corpus.open("rb") as f:
        for line in f:
            writer.write(line.rstrip(b"\n"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--records", type=int, default=120_000)
    p.add_argument("--batches", type=int, default=200, help="batches timed")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--data-dir", type=Path, default=Path("data"))
    p.add_argument("--shared-data", type=Path, default=None)
    args = p.parse_args(argv)
    shared = args.shared_data or find_shared_data()
    tokenizer = shared / "bert-base-uncased.tokenizer.json"

    corpus = args.data_dir / f"corpus-{args.records}.jsonl"
    if not corpus.exists():
        args.data_dir.mkdir(parents=True, exist_ok=True)
        print(f"building {corpus} with make_corpus.py ...", flush=True)
        subprocess.run(
            [sys.executable, str(shared / "make_corpus.py"), str(corpus), str(args.records)],
            check=True,
        )
    crec = corpus.with_suffix(".crec")
    if not crec.exists():
        t0 = time.perf_counter()
        write_crec(corpus, crec)
        print(f"wrote {crec} in {time.perf_counter() - t0:.1f} s")
    source = chute.sources.RecordFileDataSource(crec)
    print(f"corpus: {len(source):,} records, {crec.stat().st_size / 1e6:.1f} MB as .crec")

    ds = build(source, tokenizer, args.batch_size, args.workers)
    it = iter(ds)
    t0 = time.perf_counter()
    first = next(it)
    t_first = time.perf_counter() - t0
    print(
        f"time to first batch: {t_first:.3f} s   batch: "
        + ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in first.items())
    )
    t0 = time.perf_counter()
    for _ in range(args.batches):
        next(it)
    dt = time.perf_counter() - t0
    n = args.batches * args.batch_size
    print(
        f"throughput: {n / dt:,.0f} examples/s, {args.batches / dt:.1f} batches/s "
        f"({args.workers} worker processes, tokenizing on the fly)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "data_state.json"
        ckpt.write_text(json.dumps(it.get_state()))
        print(f"checkpoint after {args.batches + 1} batches: {ckpt.read_text()}")
        expected = [next(it) for _ in range(20)]
        it.close()

        other = 1 if args.workers != 1 else 0
        resumed = iter(build(source, tokenizer, args.batch_size, workers=other))
        resumed.set_state(json.loads(ckpt.read_text()))
        got = [next(resumed) for _ in range(20)]
        resumed.close()
    same = all(all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(expected, got))
    print(
        f"resumed in a fresh pipeline ({other} worker{'s' if other != 1 else ''} instead of {args.workers}): "
        f"next 20 batches {'identical' if same else 'DIFFERENT'}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
