"""The tokenize step of benchmarks/bench_beam.py, importable by Beam's worker processes
(the benchmark puts this directory on PYTHONPATH)."""

from __future__ import annotations

from typing import Any

import numpy as np

import chute

_TOKENIZERS: dict[str, Any] = {}


class TokenizeToRecord(chute.transforms.Map):
    """Seed 003's tokenize of the description, stored as int32 token ids (bytes)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def map(self, element: dict[str, Any]) -> bytes:
        tokenizer = _TOKENIZERS.get(self.path)
        if tokenizer is None:
            from tokenizers import Tokenizer

            tokenizer = _TOKENIZERS[self.path] = Tokenizer.from_file(self.path)
        ids = tokenizer.encode(element["description"]).ids
        return np.asarray(ids, dtype=np.int32).tobytes()
