"""Transformations for the Beam tests, importable by Beam's worker processes (the tests
put this directory on PYTHONPATH, which the DirectRunner hands to its workers)."""

from __future__ import annotations

import json
import time
import zlib
from typing import Any

import numpy as np

import chute


class HashTokenize(chute.transforms.Map):
    """A deterministic stand-in for a tokenizer: one id per word (CRC32 of the word)."""

    def map(self, element: dict[str, Any]) -> np.ndarray:
        words = str(element["text"]).split()
        return np.asarray([zlib.crc32(w.encode()) % 30522 for w in words], dtype=np.int32)


class BertTokenize(chute.transforms.Map):
    """The real bert-base-uncased tokenizer from shared/data, loaded once per process."""

    _loaded: dict[str, Any] = {}

    def __init__(self, path: str, field: str = "description") -> None:
        self.path = path
        self.field = field

    def map(self, element: dict[str, Any]) -> np.ndarray:
        tok = self._loaded.get(self.path)
        if tok is None:
            from tokenizers import Tokenizer

            tok = self._loaded[self.path] = Tokenizer.from_file(self.path)
        return np.asarray(tok.encode(element[self.field]).ids, dtype=np.int32)


class Crop(chute.transforms.RandomMap):
    """A random crop: a random window of at most 8 ids (the online pipeline's draw)."""

    def random_map(self, element: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if len(element) <= 8:
            return element
        start = int(rng.integers(0, len(element) - 8))
        return element[start : start + 8]


class NotEmpty(chute.transforms.Filter):
    def filter(self, element: np.ndarray) -> bool:
        return len(element) > 0


class ToBytes(chute.transforms.Map):
    def map(self, element: np.ndarray) -> bytes:
        return np.ascontiguousarray(element, dtype=np.int32).tobytes()


def row_to_bytes(row: dict[str, Any]) -> bytes:
    return json.dumps(row, sort_keys=True).encode()


def slow_copy(record: bytes) -> bytes:
    """Identity, slowly: a job long enough to be killed in the middle."""
    time.sleep(0.001)
    return record


PREPROCESS = [HashTokenize(), Crop(), NotEmpty(), ToBytes()]
