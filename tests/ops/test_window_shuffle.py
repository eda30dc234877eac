"""Window shuffles: a permutation within each window, keyed by seed, restorable."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.experimental import WindowShuffleIterDataset, WindowShuffleMapDataset
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


@given(n=st.integers(1, 60), window=st.integers(1, 13), seed=st.integers(0, 3))
@settings(max_examples=40, deadline=None)
def test_each_window_is_a_permutation_of_its_elements(n: int, window: int, seed: int) -> None:
    for ds in (
        WindowShuffleMapDataset(chute.MapDataset.range(n), window_size=window, seed=seed),
        WindowShuffleIterDataset(
            chute.MapDataset.range(n).to_iter_dataset(), window_size=window, seed=seed
        ),
    ):
        out = list(ds)
        assert len(out) == n
        for start in range(0, n, window):
            assert sorted(out[start : start + window]) == list(range(start, min(n, start + window)))


def test_shuffles_differ_by_window_epoch_and_seed() -> None:
    base = chute.MapDataset.range(1000)
    a = list(WindowShuffleMapDataset(base, window_size=100, seed=1))
    assert a != list(range(1000)) and a == list(
        WindowShuffleMapDataset(base, window_size=100, seed=1)
    )
    assert a != list(WindowShuffleMapDataset(base, window_size=100, seed=2))
    assert [x - 100 for x in a[100:200]] != a[:100]
    two = list(WindowShuffleMapDataset(base.repeat(2), window_size=100, seed=1))
    assert two[:1000] != two[1000:] and sorted(two[1000:1100]) == list(range(100))
    it = list(WindowShuffleIterDataset(base.to_iter_dataset(), window_size=100, seed=1))
    assert it != list(range(1000)) and sorted(it[:100]) == list(range(100))


def test_seed_from_the_pipeline_and_errors() -> None:
    ds = chute.MapDataset.range(50).seed(7)
    assert list(WindowShuffleMapDataset(ds, window_size=10)) == list(
        WindowShuffleMapDataset(ds, window_size=10)
    )
    with pytest.raises(ValueError, match="window_size=0 is invalid"):
        WindowShuffleMapDataset(ds, window_size=0)
    with pytest.raises(ValueError, match=r"has no seed.*ds.seed\(42\)"):
        WindowShuffleIterDataset(chute.MapDataset.range(5).to_iter_dataset(), window_size=2)


def test_restore_at_every_step_mid_window_and_across_epochs() -> None:
    stream = chute.MapDataset.range(23).repeat(2).to_iter_dataset().filter(lambda x: x % 5 != 0)
    assert_equal_output_after_checkpoint(WindowShuffleIterDataset(stream, window_size=6, seed=3))
    assert_equal_output_after_checkpoint(
        WindowShuffleIterDataset(stream, window_size=6, seed=3).batch(4)
    )
    mapped = WindowShuffleMapDataset(chute.MapDataset.range(23).repeat(2), window_size=5, seed=3)
    assert_equal_output_after_checkpoint(mapped.to_iter_dataset())


def _workers(n: int) -> chute.IterDataset[Any]:
    ds = WindowShuffleMapDataset(chute.MapDataset.range(400), window_size=64, seed=5)
    it = ds.to_iter_dataset().mp_prefetch(chute.MultiprocessingOptions(num_workers=n))
    return WindowShuffleIterDataset(it, window_size=50, seed=9)


def test_same_output_for_0_and_3_workers() -> None:
    assert_trees_equal(list(_workers(3)), list(_workers(0)))
    assert_equal_output_after_checkpoint(
        _workers(0), restore_into=_workers(3), max_elements=400, steps=[0, 1, 49, 50, 220, 399, 400]
    )
