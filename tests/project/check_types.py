"""What type checkers infer for chute pipelines: `assert_type` expectations.

mypy checks this file with the rest of `tests/` (`.ci/run`), so an inference that changes
fails CI; `test_typing.py` also checks it under mypy's default settings and shows that a
wrong expectation is reported. Nothing here is annotated that a user would not annotate:
lambdas, named functions and transform objects go in as they are written. The functions
are never called; importing this file builds nothing.
"""

from __future__ import annotations

from typing import Any, assert_type

import numpy as np
import numpy.typing as npt

import chute
from chute import DatasetIterator, IterDataset, MapDataset
from chute.experimental import (
    LimitIterDataset,
    ThreadPrefetchIterDataset,
    WindowShuffleIterDataset,
    WindowShuffleMapDataset,
)

Array = npt.NDArray[Any]


def halve(x: int) -> float:
    return x / 2


def is_small(x: float) -> bool:
    return x < 3


def tag(index: int, x: float) -> tuple[int, float]:
    return index, x


def jitter(x: float, rng: np.random.Generator) -> float:
    return x + rng.random()


def to_text(d: MapDataset[float], digits: int) -> MapDataset[str]:
    return d.map(lambda x: f"{x:.{digits}f}")


class Tokenize(chute.MapTransform):
    """A transform object; its element types come from `map`'s annotations."""

    def map(self, element: str) -> list[int]:
        return [ord(c) for c in element]


class Scale(chute.MapTransform[float, float]):
    """A transform object that names its types on the base class."""

    def map(self, element: float) -> float:
        return element * 2


class NotEmpty(chute.FilterTransform):
    def filter(self, element: list[int]) -> bool:
        return bool(element)


class Noise(chute.RandomMapTransform):
    def random_map(self, element: float, rng: np.random.Generator) -> float:
        return element + rng.normal()


class Position(chute.MapWithIndex):
    def map_with_index(self, index: int, element: str) -> tuple[int, str]:
        return index, element


class Loose(chute.MapTransform):
    """Unannotated elements stay `Any`."""

    def map(self, element: Any) -> Any:
        return element


def map_dataset() -> None:
    ds = MapDataset.range(10)
    assert_type(ds, MapDataset[int])
    assert_type(ds.map(lambda x: x * 2.0), MapDataset[float])
    assert_type(ds.map(str), MapDataset[str])
    assert_type(ds.map(halve), MapDataset[float])
    assert_type(ds.map(halve).filter(is_small), MapDataset[float])
    assert_type(ds.filter(lambda x: x % 2), MapDataset[int])  # any truthy result will do
    assert_type(ds.map_with_index(lambda i, x: (i, x)), MapDataset[tuple[int, int]])
    assert_type(ds.map_with_index(tag), MapDataset[tuple[int, float]])
    assert_type(ds.random_map(lambda x, rng: x + rng.random(), seed=1), MapDataset[float])
    assert_type(ds.random_map(jitter, seed=1), MapDataset[float])
    assert_type(ds.shuffle(seed=1).repeat(2).seed(3).slice(slice(1, None, 2)), MapDataset[int])
    assert_type(ds[3], int)
    assert_type(ds[np.int64(3)], int)
    assert_type(ds[2:8:2], MapDataset[int])
    assert_type(len(ds), int)
    assert_type(ds.pipe(to_text, 2), MapDataset[str])
    assert_type(ds.pipe(lambda d: d.map(str)), MapDataset[str])


def transform_objects() -> None:
    text = MapDataset.range(10).map(str)
    assert_type(text.map(Tokenize()), MapDataset[list[int]])
    assert_type(text.map(Tokenize()).filter(NotEmpty()), MapDataset[list[int]])
    assert_type(text.map_with_index(Position()), MapDataset[tuple[int, str]])
    floats = MapDataset.range(10).map(float)
    assert_type(floats.map(Scale()), MapDataset[float])
    assert_type(floats.random_map(Noise(), seed=1), MapDataset[float])
    assert_type(floats.map(Loose()), MapDataset[Any])
    assert_type(floats.map(chute.transforms.TypeConversion(np.float32)), MapDataset[Any])
    assert_type(floats.to_iter_dataset().map(Scale()), IterDataset[float])
    assert_type(text.to_iter_dataset().map(Tokenize()).filter(NotEmpty()), IterDataset[list[int]])
    assert_type(floats.to_iter_dataset().random_map(Noise(), seed=1), IterDataset[float])
    assert_type(text.to_iter_dataset().map_with_index(Position()), IterDataset[tuple[int, str]])


def sources_and_combinations() -> None:
    assert_type(MapDataset.source([b"a", b"b"]), MapDataset[bytes])
    assert_type(MapDataset.source(("x", "y")), MapDataset[str])
    assert_type(MapDataset.source(chute.sources.RangeDataSource(0, 9, 1)), MapDataset[int])
    assert_type(MapDataset.source(chute.sources.RecordFileDataSource("d.crec")), MapDataset[bytes])
    ints, more = MapDataset.range(3), MapDataset.range(5)
    assert_type(MapDataset.concatenate([ints, more]), MapDataset[int])
    assert_type(MapDataset.mix([ints, more], [1.0, 2.0]), MapDataset[int])
    # A dataset of int is a dataset of object (datasets are covariant): mixing kinds joins.
    assert_type(MapDataset.mix([ints, ints.map(str)]), MapDataset[object])
    assert_type(IterDataset.mix({"a": ints.to_iter_dataset()}), IterDataset[int])


def batches() -> None:
    ds = MapDataset.range(10)
    # Numbers and arrays stack into one array; a batch_fn gives what it returns; other
    # elements (dicts, tuples: trees of arrays) are Any.
    assert_type(ds.batch(4), MapDataset[Array])
    assert_type(ds.map(float).batch(4, drop_remainder=True), MapDataset[Array])
    assert_type(ds.map(lambda x: np.zeros(x)).batch(2), MapDataset[Array])
    assert_type(ds.batch(4, batch_fn=tuple), MapDataset[tuple[int, ...]])
    assert_type(ds.batch(4, batch_fn=sum), MapDataset[int])
    assert_type(ds.map(lambda x: {"x": x}).batch(4), MapDataset[Any])
    it = ds.to_iter_dataset()
    assert_type(it.batch(4), IterDataset[Array])
    assert_type(it.batch(4, batch_fn=lambda xs: len(xs)), IterDataset[int])
    assert_type(it.map(lambda x: (x, x)).batch(4), IterDataset[Any])


def iter_dataset_and_iterators() -> None:
    ds = MapDataset.range(10).map(halve)
    it_ds = ds.to_iter_dataset(chute.ReadOptions(num_threads=2))
    assert_type(it_ds, IterDataset[float])
    assert_type(it_ds.map(lambda x: round(x)), IterDataset[int])
    assert_type(it_ds.filter(is_small).repeat(2).limit(5).seed(1), IterDataset[float])
    assert_type(it_ds.cache(), IterDataset[float])
    assert_type(it_ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)), IterDataset[float])
    assert_type(it_ds.batch(2).mp_prefetch(), IterDataset[Array])
    assert_type(it_ds.pipe(lambda d, n: d.limit(n), 3), IterDataset[float])
    assert_type(iter(it_ds), DatasetIterator[float])
    assert_type(next(iter(it_ds)), float)
    assert_type(iter(ds), DatasetIterator[float])
    for batch in ds.batch(2):
        assert_type(batch, Array)
    assert_type(list(ds.batch(2)), list[Array])
    # (`iter(...)` of a MapDataset of arrays reads as Any: it matches two overloads of
    # `iter`, the `__iter__` one and the `__getitem__` one, and the array type holds Any.)
    for x in it_ds:
        assert_type(x, float)
    with iter(it_ds) as iterator:
        assert_type(next(iterator), float)
        assert_type(iterator.get_state(), dict[str, Any])


def experimental_stages() -> None:
    it_ds = MapDataset.range(10).map(str).to_iter_dataset()
    assert_type(
        ThreadPrefetchIterDataset(it_ds, prefetch_buffer_size=2), ThreadPrefetchIterDataset[str]
    )
    assert_type(
        WindowShuffleIterDataset(it_ds, window_size=4, seed=1), WindowShuffleIterDataset[str]
    )
    assert_type(LimitIterDataset(it_ds, 3), LimitIterDataset[str])
    assert_type(
        WindowShuffleMapDataset(MapDataset.range(5), window_size=2, seed=1),
        WindowShuffleMapDataset[int],
    )
    assert_type(next(iter(ThreadPrefetchIterDataset(it_ds, prefetch_buffer_size=2))), str)
