"""The functions and user stages the conformance pipelines are made of.

Module-level (picklable by reference: the worker processes import this module through
`sys.path`, which `tests/conftest.py` extends). Every element is a dict whose `"id"` is
the identity of its source record (`base + i`), so the suite can count each record; the
maps change only `"v"`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

import chute
from chute.experimental import FlatMapTransform
from chute.transforms import DatasetSelectionMap

# -- element functions ------------------------------------------------------------------------


def tag(base: int, i: int) -> dict[str, Any]:
    return {"id": base + int(i), "v": int(i) % 11}


def tag0(i: int) -> dict[str, Any]:
    return tag(0, i)


def tag1000(i: int) -> dict[str, Any]:
    return tag(1000, i)


def tag2000(i: int) -> dict[str, Any]:
    return tag(2000, i)


TAGS = {0: tag0, 1000: tag1000, 2000: tag2000}


def records(base: int, n: int) -> list[dict[str, Any]]:
    return [tag(base, i) for i in range(n)]


def add_one(x: dict[str, Any]) -> dict[str, Any]:
    """The drawn `map`: works on one element, a batch, or a packed row."""
    return {**x, "v": x["v"] + 1}


def jitter(x: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """The drawn `random_map`: its draws depend on the element's key, not on a worker."""
    return {**x, "v": x["v"] + int(rng.integers(0, 1000))}


def first_id(x: Any) -> int:
    return int(np.asarray(x["id"]).ravel()[0])


class KeepIdNotMultiple:
    """The drawn `filter`: drops the records whose first id is a multiple of `k`."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, x: Any) -> bool:
        return first_id(x) % self.k != 0

    def __repr__(self) -> str:
        return f"keep_id_not_multiple_of({self.k})"


def merge_pair(t: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    """After a zip: the first component's identity, both values."""
    return {"id": t[0]["id"], "v": t[0]["v"] + t[1]["v"]}


def seq_length(x: dict[str, Any]) -> int:
    """The length the packers, `batch_by_tokens` and buckets see: 1 to 4."""
    return 1 + int(x["id"]) % 4


def bucket_length(x: dict[str, Any]) -> int:
    return int(x["id"]) % 7


def as_sequence(x: dict[str, Any]) -> dict[str, Any]:
    """A record as a sequence for the packers: every token carries the record's id."""
    n = seq_length(x)
    return {
        "id": np.full(n, x["id"], dtype=np.int64),
        "v": np.full(n, x["v"], dtype=np.int64),
    }


def mix_weights_by_step(step: int) -> list[float]:
    """Weights as a function of the step (`mix(..., weights=fn)`)."""
    return [1.0, 3.0] if step % 2 == 0 else [2.0, 1.0]


def mix_weights_by_step_named(step: int) -> dict[str, float]:
    """The same, for a mixture given as a dict."""
    a, b = mix_weights_by_step(step)
    return {"a": a, "b": b}


def read_shard(k: int, n: int) -> Iterator[dict[str, Any]]:
    """A shard of an interleave, written as a plain generator (docs/extending.md)."""
    for i in range(n):
        yield tag(3000 + 100 * k, i)


def shard_reader(k: int, n: int) -> Any:
    return functools.partial(read_shard, k, n)


def parts_of(record_id: int, k: int) -> int:
    """How many parts the drawn flat map (`SplitInto(k)`) makes of a record: 0 to `k`."""
    return int(record_id) % (k + 1)


class SplitInto(FlatMapTransform):
    """The drawn flat map: an element (a record, a batch or a packed row) becomes
    `parts_of(first id, k)` copies, part `j` with `j` added to `"v"`; every part keeps the
    element's `"id"`, so the suite still counts each record (0 parts drops it). With
    `bounded=False`, `max_fan_out` is None (no limit, `FlatMapIterDataset` only)."""

    max_fan_out: int | None

    def __init__(self, k: int, bounded: bool = True) -> None:
        self.k = k
        self.max_fan_out = k if bounded else None

    def flat_map(self, element: Any) -> list[Any]:
        return [
            {**element, "v": element["v"] + j} for j in range(parts_of(first_id(element), self.k))
        ]

    def __repr__(self) -> str:
        return f"split_into({self.k}, max_fan_out={self.max_fan_out})"


def selection(n1: int, n2: int, seed: int, length: int) -> list[tuple[int, int]]:
    """The first `length` pairs of a seeded permutation of every (dataset, index) of two
    datasets of `n1` and `n2` records: each record at most once."""
    pairs = [(0, i) for i in range(n1)] + [(1, i) for i in range(n2)]
    order = np.random.default_rng(seed).permutation(len(pairs))
    return [pairs[int(k)] for k in order[:length]]


class Selection(DatasetSelectionMap):
    """The drawn `MapDataset.select_from_datasets` map (`selection(...)`)."""

    def __init__(self, n1: int, n2: int, seed: int, length: int) -> None:
        self._pairs = selection(n1, n2, seed, length)

    def __len__(self) -> int:
        return len(self._pairs)

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self._pairs[index]


def parse_jsonl(line: bytes) -> dict[str, Any]:
    import json

    d = json.loads(line)
    return {"id": int(d["id"]), "v": int(d["v"])}


# -- DataLoader transforms --------------------------------------------------------------------


class AddOne(chute.MapTransform):
    def map(self, element: Any) -> Any:
        return add_one(element)


class Jitter(chute.RandomMapTransform):
    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        return jitter(element, rng)


class AsSequence(chute.MapTransform):
    """A record as a sequence, before the DataLoader's `PackAndBatchOperation`."""

    def map(self, element: Any) -> Any:
        return as_sequence(element)


class KeepNotMultiple(chute.FilterTransform):
    def __init__(self, k: int) -> None:
        self.k = k

    def filter(self, element: Any) -> bool:
        return first_id(element) % self.k != 0


# -- user stages, written as docs/extending.md shows ----------------------------------------


class CountdownIterator(chute.DatasetIterator[dict]):
    """A stream source of its own: records `base + n - 1` down to `base`."""

    def __init__(self, base: int, start: int) -> None:
        super().__init__()
        self._base = base
        self._left = start

    def __next__(self) -> dict:
        if self._left == 0:
            raise StopIteration
        self._left -= 1
        return tag(self._base, self._left)

    def get_state(self) -> dict:
        return {"left": self._left}

    def set_state(self, state: dict) -> None:
        self._left = state["left"]


class Countdown(chute.IterDataset[dict]):
    def __init__(self, base: int, start: int) -> None:
        super().__init__()
        self._base = base
        self._start = start

    def __iter__(self) -> CountdownIterator:
        return CountdownIterator(self._base, self._start)


class StampIterator(chute.DatasetIterator[Any]):
    """A stage reading another stream: adds a running count to `"v"`."""

    def __init__(self, parent: chute.DatasetIterator[Any]) -> None:
        super().__init__(parent)
        self._parent = parent
        self._count = 0

    def __next__(self) -> Any:
        x = next(self._parent)
        self._count += 1
        return {**x, "v": x["v"] + self._count}

    def get_state(self) -> dict:
        return {"count": self._count, "upstream": self._parent.get_state()}

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state["upstream"])
        self._count = state["count"]


class Stamp(chute.IterDataset[Any]):
    def __init__(self, parent: chute.IterDataset[Any]) -> None:
        super().__init__([parent])
        self._parent = parent

    def __iter__(self) -> StampIterator:
        return StampIterator(iter(self._parent))

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """One element for one (docs/extending.md, `_origins`): provenance passes through."""
        return [chute.experimental.Origin(0, position)]


class Records(chute.MapDataset[dict]):
    """A random-access source of its own (`__len__` + `__getitem__`, docs/extending.md)."""

    def __init__(self, base: int, n: int) -> None:
        super().__init__()
        self._base = base
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return tag(self._base, index % self._n)
