"""MapDataset semantics: access, slicing, map, filter, batch, repeat, seed, pipe."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import chute
from chute.testing import assert_equal_output_after_checkpoint


def test_range_and_source_random_access() -> None:
    ds = chute.MapDataset.range(2, 20, 3)
    assert len(ds) == 6
    assert [ds[i] for i in range(6)] == list(range(2, 20, 3))
    assert ds[-1] == 17
    src = chute.MapDataset.source(["a", "b", "c"])
    assert len(src) == 3 and src[1] == "b" and list(src) == ["a", "b", "c"]
    assert list(chute.MapDataset.range(4)) == [0, 1, 2, 3]


def test_indices_past_the_end_address_later_epochs() -> None:
    ds = chute.MapDataset.source(["a", "b", "c"])
    assert ds[3] == "a" and ds[7] == "b"


@given(
    n=st.integers(0, 60),
    start=st.none() | st.integers(-70, 70),
    stop=st.none() | st.integers(-70, 70),
    step=st.none() | st.integers(-7, 7).filter(lambda s: s != 0),
)
def test_slicing_matches_python_lists(
    n: int, start: int | None, stop: int | None, step: int | None
) -> None:
    data = list(range(100, 100 + n))
    ds = chute.MapDataset.source(data)[start:stop:step]
    expected = data[start:stop:step]
    assert len(ds) == len(expected)
    assert list(ds) == expected


def test_slices_compose_and_shard() -> None:
    ds = chute.MapDataset.range(100)
    assert list(ds[10:90][::7][1:5]) == list(range(100))[10:90][::7][1:5]
    shards = [list(ds[k::3]) for k in range(3)]
    assert sorted(sum(shards, [])) == list(range(100))


def test_map_filter_map_with_index() -> None:
    ds = chute.MapDataset.range(10).map(lambda x: x * 2).filter(lambda x: x % 3 != 0)
    assert ds[0] is None and ds[1] == 2
    assert list(ds) == [2, 4, 8, 10, 14, 16]
    indexed = chute.MapDataset.source(["a", "b"]).map_with_index(lambda i, x: f"{i}{x}")
    assert list(indexed) == ["0a", "1b"]
    assert list(indexed.repeat(2)) == ["0a", "1b", "2a", "3b"]


def test_transform_classes_work_like_functions() -> None:
    class Double(chute.transforms.Map):
        def map(self, element: int) -> int:
            return element * 2

    class Odd(chute.transforms.Filter):
        def filter(self, element: int) -> bool:
            return element % 2 == 1

    class Tag(chute.MapWithIndex):
        def map_with_index(self, index: int, element: int) -> tuple[int, int]:
            return index, element

    ds = chute.MapDataset.range(5).filter(Odd()).map(Double()).map_with_index(Tag())
    assert list(ds) == [(1, 2), (3, 6)]


@dataclasses.dataclass
class Pair:
    x: np.ndarray
    y: float


class Point(NamedTuple):
    a: int
    b: np.ndarray


def test_batch_stacks_nested_structures() -> None:
    ds = chute.MapDataset.range(5).map(
        lambda i: {
            "tokens": np.full(3, i, np.int32),
            "meta": (i, float(i) / 2, f"s{i}"),
            "pair": Pair(np.arange(2) + i, float(i)),
            "point": Point(i, np.array([i, -i])),
            "list": [i, i + 1],
        }
    )
    b = ds.batch(2)[0]
    assert b["tokens"].dtype == np.int32 and b["tokens"].shape == (2, 3)
    assert b["meta"][0].tolist() == [0, 1] and b["meta"][1].tolist() == [0.0, 0.5]
    assert b["meta"][2].tolist() == ["s0", "s1"]
    assert isinstance(b["pair"], Pair) and b["pair"].x.tolist() == [[0, 1], [1, 2]]
    assert isinstance(b["point"], Point) and b["point"].b.tolist() == [[0, 0], [1, -1]]
    assert isinstance(b["list"], list) and b["list"][1].tolist() == [1, 2]


def test_batch_remainder_and_batch_fn() -> None:
    ds = chute.MapDataset.range(7)
    assert [b.tolist() for b in ds.batch(3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(ds.batch(3, drop_remainder=True)) == 2
    assert list(ds.batch(3, batch_fn=sum)) == [3, 12, 6]


def test_batch_per_epoch_of_repeat_and_after_filter() -> None:
    ds = chute.MapDataset.range(5).batch(2, drop_remainder=True).repeat(2)
    assert [b.tolist() for b in ds] == [[0, 1], [2, 3], [0, 1], [2, 3]]
    filtered = chute.MapDataset.range(6).filter(lambda x: x % 3 != 0).batch(3)
    assert [b.tolist() for b in filtered] == [[1, 2], [4, 5]]
    all_filtered = chute.MapDataset.range(6).filter(lambda x: x > 2).batch(3)
    assert all_filtered[0] is None and [b.tolist() for b in all_filtered] == [[3, 4, 5]]


def test_batch_of_ragged_arrays_names_the_fix() -> None:
    ds = chute.MapDataset.range(3).map(lambda i: np.zeros(i + 1)).batch(3)
    with pytest.raises(ValueError, match=r"different shapes .*pad them first"):
        ds[0]


def test_repeat() -> None:
    ds = chute.MapDataset.range(3).repeat(2)
    assert len(ds) == 6 and list(ds) == [0, 1, 2, 0, 1, 2]
    forever = chute.MapDataset.range(3).repeat()
    assert len(forever) == chute._src.core.dataset.INFINITE  # the sys.maxsize convention of Grain
    it = iter(forever)
    assert [next(it) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_pipe_and_seed() -> None:
    def add(ds: chute.MapDataset[int], k: int) -> chute.MapDataset[int]:
        return ds.map(lambda x: x + k)

    assert list(chute.MapDataset.range(3).pipe(add, k=10)) == [10, 11, 12]
    a = chute.MapDataset.range(50).seed(7).shuffle()
    b = chute.MapDataset.range(50).seed(7).shuffle()
    c = chute.MapDataset.range(50).seed(8).shuffle()
    assert list(a) == list(b) != list(c)


def test_map_dataset_iteration_checkpoints() -> None:
    ds = (
        chute.MapDataset.range(30)
        .map(lambda x: x * 3)
        .filter(lambda x: x % 2 == 0)
        .map_with_index(lambda i, x: (i, x))
        .batch(4)
    )
    assert_equal_output_after_checkpoint(ds)
    assert_equal_output_after_checkpoint(chute.MapDataset.range(7).batch(2).repeat(3))
