"""The shared news-like corpus as an ArrayRecord file, built once and cached in bench_out/.

`corpus_array_record(n)` runs ../shared/data/make_corpus.py for `n` records and writes
them, one JSON record per ArrayRecord record, with `group_size:1` (seed 003's layout, the
one random access wants). Both files are reused while they exist; a partial file is never
left under the final name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from _harness import shared_data

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench_out"


def tokenizer_path() -> Path:
    return shared_data() / "bert-base-uncased.tokenizer.json"


def corpus_jsonl(n: int) -> Path:
    path = OUT / f"corpus_{n}.jsonl"
    if not path.exists():
        OUT.mkdir(exist_ok=True)
        tmp = path.with_suffix(".jsonl.tmp")
        script = shared_data() / "make_corpus.py"
        subprocess.run([sys.executable, str(script), str(tmp), str(n)], check=True)
        tmp.rename(path)
    return path


def corpus_array_record(n: int) -> Path:
    """`bench_out/corpus_N.array_record`: the corpus's lines as ArrayRecord records."""
    path = OUT / f"corpus_{n}.array_record"
    if path.exists():
        return path
    from array_record.python.array_record_module import ArrayRecordWriter

    source = corpus_jsonl(n)
    tmp = OUT / f"corpus_{n}.array_record.tmp"
    writer = ArrayRecordWriter(str(tmp), "group_size:1")
    with open(source, "rb") as f:
        for line in f:
            writer.write(line.rstrip(b"\n"))
    writer.close()
    tmp.rename(path)
    return path


_TOKENIZERS: dict[str, Any] = {}


class Tokenize:
    """Seed 003's `tokenize`, the tokenizer loaded once per process, on first use (so the
    transform pickles small and worker processes load their own)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or str(tokenizer_path())

    def __call__(self, element: dict[str, Any]) -> dict[str, np.ndarray]:
        tokenizer = _TOKENIZERS.get(self.path)
        if tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = _TOKENIZERS[self.path] = Tokenizer.from_file(self.path)
        ids = tokenizer.encode(element["description"]).ids
        return {"description": np.asarray(ids, dtype=np.int32)}

    def __repr__(self) -> str:
        return "Tokenize(bert-base-uncased)"
