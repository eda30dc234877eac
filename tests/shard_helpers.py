"""Streams and transforms for the tests of streams in worker processes (importable by
the workers, which get this directory on `sys.path`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any


def rows(shard: int, n: int) -> Iterator[dict[str, int]]:
    """A user's reader of one shard: `n` rows, read in order."""
    for r in range(n):
        yield {"shard": shard, "row": r}


class Rows:
    """`rows(shard, n)` as a picklable zero-argument factory."""

    def __init__(self, shard: int, n: int) -> None:
        self.shard, self.n = shard, n

    def __call__(self) -> Iterator[dict[str, int]]:
        return rows(self.shard, self.n)


class FailingRows(Rows):
    """Raises at row `at` of its shard."""

    def __init__(self, shard: int, n: int, at: int) -> None:
        super().__init__(shard, n)
        self.at = at

    def __call__(self) -> Iterator[dict[str, int]]:
        for row in rows(self.shard, self.n):
            if row["row"] == self.at:
                raise ValueError(f"bad row {self.at} in shard {self.shard}")
            yield row


class SlowRows(Rows):
    """Sleeps `latency` seconds per row (a remote file read in small pieces)."""

    def __init__(self, shard: int, n: int, latency: float) -> None:
        super().__init__(shard, n)
        self.latency = latency

    def __call__(self) -> Iterator[dict[str, int]]:
        for row in rows(self.shard, self.n):
            time.sleep(self.latency)
            yield row


class StreamingCorpus:
    """Shaped like Hugging Face's `datasets.IterableDataset` built from local files:
    iterable, with `state_dict()`/`load_state_dict()`; after a load, the next iteration
    starts from the loaded position."""

    def __init__(self, shards: list[list[str]]) -> None:
        self._shards = shards
        self._position = {"shard": 0, "row": 0}
        self._start = {"shard": 0, "row": 0}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start, self._start = self._start, {"shard": 0, "row": 0}
        for s in range(start["shard"], len(self._shards)):
            first = start["row"] if s == start["shard"] else 0
            for r in range(first, len(self._shards[s])):
                self._position = {"shard": s, "row": r + 1}
                yield {"text": self._shards[s][r], "shard": s}

    def state_dict(self) -> dict[str, int]:
        return dict(self._position)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = dict(state)
        self._position = dict(state)


def key(x: dict[str, int]) -> tuple[int, int]:
    return x["shard"], x["row"]


def keep(t: tuple[int, int]) -> bool:
    return t[1] % 3 != 1
