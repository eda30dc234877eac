"""The shared news-like corpus as an ArrayRecord file, built once and cached in bench_out/.

`corpus_array_record(n)` runs ../shared/data/make_corpus.py for `n` records and writes
them, one JSON record per ArrayRecord record, with `group_size:1` (seed 003's layout, the
one random access wants). Both files are reused while they exist; a partial file is never
left under the final name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench_out"


def shared_data() -> Path:
    env = os.environ.get("CHUTE_SHARED_DATA")
    if env:
        return Path(env)
    for parent in REPO.parents:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    raise SystemExit("shared/data not found beside the checkout: set CHUTE_SHARED_DATA")


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
