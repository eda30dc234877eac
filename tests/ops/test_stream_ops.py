"""repeat, limit, flat_map and zip, on MapDataset and IterDataset."""

from __future__ import annotations

from typing import Any

import pytest

import chute
from chute.experimental import (
    FlatMapIterDataset,
    FlatMapMapDataset,
    FlatMapTransform,
    LimitIterDataset,
    RepeatIterDataset,
    ZipIterDataset,
    ZipMapDataset,
)
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal
from stream_helpers import First as _First
from stream_helpers import Upto


def _stream(n: int = 12) -> chute.IterDataset[int]:
    return chute.MapDataset.range(n).shuffle(seed=2).to_iter_dataset()


def test_repeat_and_limit() -> None:
    ds = _stream(5)
    once = list(ds)
    assert list(ds.repeat(3)) == once * 3
    assert list(RepeatIterDataset(ds, 2)) == once * 2
    assert list(ds.repeat().limit(12)) == (once * 3)[:12]
    assert list(LimitIterDataset(ds, 3)) == once[:3]
    assert list(ds.limit(100)) == once
    assert list(ds.filter(lambda x: False).repeat()) == []  # an empty stream stays empty
    assert_equal_output_after_checkpoint(ds.repeat(3))
    assert_equal_output_after_checkpoint(ds.repeat().limit(13).batch(2))
    with pytest.raises(ValueError, match="num_epochs=0 is invalid"):
        ds.repeat(0)
    with pytest.raises(ValueError, match="count=-1 is invalid"):
        ds.limit(-1)


def test_flat_map_on_both_dataset_kinds() -> None:
    expected = [x * 10 + j for x in range(12) for j in range(x % 4)]
    mapped = FlatMapMapDataset(chute.MapDataset.range(12), Upto())
    assert len(mapped) == 36 and mapped[3] == 10 and mapped[4] is None
    assert list(mapped) == expected
    it = FlatMapIterDataset(chute.MapDataset.range(12).to_iter_dataset(), Upto())
    assert list(it) == expected
    assert_equal_output_after_checkpoint(it)
    assert_equal_output_after_checkpoint(FlatMapIterDataset(_stream().repeat(2), Upto()).batch(4))
    assert_equal_output_after_checkpoint(mapped.shuffle(seed=1).to_iter_dataset())


def test_flat_map_errors_name_the_fix() -> None:
    class TooMany(FlatMapTransform):
        max_fan_out = 1

        def flat_map(self, element: int) -> list[int]:
            return [element, element]

    with pytest.raises(ValueError, match="made 2 elements from element 0, over max_fan_out=1"):
        list(FlatMapIterDataset(_stream(), TooMany()))
    with pytest.raises(TypeError, match="is not a FlatMapTransform"):
        FlatMapMapDataset(chute.MapDataset.range(3), lambda x: [x])  # type: ignore[arg-type]


def test_zip() -> None:
    a, b = chute.MapDataset.range(5), chute.MapDataset.range(100, 103).map(str)
    assert list(ZipMapDataset([a, b])) == [(0, "100"), (1, "101"), (2, "102")]
    assert ZipMapDataset([a, b])[4] == (1, "101")  # epoch 2
    zipped = ZipIterDataset(
        [_stream(), _stream(7).filter(lambda x: x % 2 == 0), _stream(9)], strict=False
    )
    out = list(zipped)
    assert len(out) == 4
    assert_equal_output_after_checkpoint(ZipMapDataset([a, b]).repeat(2).to_iter_dataset())
    assert_equal_output_after_checkpoint(zipped)
    assert_equal_output_after_checkpoint(
        ZipIterDataset([_stream().repeat(2), _stream(20)], strict=False)
    )


def _workers(n: int) -> chute.IterDataset[Any]:
    ds = chute.MapDataset.range(300).shuffle(seed=4).to_iter_dataset()
    other = chute.MapDataset.range(1000, 1200).to_iter_dataset()
    zipped = ZipIterDataset([ds, other], strict=False).mp_prefetch(
        chute.MultiprocessingOptions(num_workers=n)
    )
    return FlatMapIterDataset(zipped.map(lambda ab: ab[0]), Upto()).repeat(2).limit(350)


def test_same_output_for_0_and_3_workers() -> None:
    assert_trees_equal(list(_workers(3)), list(_workers(0)))
    assert_equal_output_after_checkpoint(
        _workers(0), restore_into=_workers(3), max_elements=350, steps=[0, 1, 100, 299, 349, 350]
    )


def _map_side(n: int) -> chute.IterDataset[Any]:
    parts = [chute.MapDataset.range(40).shuffle(seed=1), chute.MapDataset.range(100, 130)]
    ds: chute.MapDataset[Any] = chute.MapDataset.concatenate(parts)
    ds = ZipMapDataset(
        [ds, chute.MapDataset.select_from_datasets(parts, [(1, i) for i in range(70)])]
    )
    ds = FlatMapMapDataset(chute.MapDataset.mix([ds, ds.shuffle(seed=3)], [2, 1]), _First())
    return ds.to_iter_dataset().mp_prefetch(chute.MultiprocessingOptions(num_workers=n))


def test_map_side_operations_give_the_same_output_for_0_and_3_workers() -> None:
    assert_trees_equal(list(_map_side(3)), list(_map_side(0)))
    assert_equal_output_after_checkpoint(
        _map_side(0), restore_into=_map_side(3), max_elements=300, steps=[0, 1, 77, 150, 299]
    )
