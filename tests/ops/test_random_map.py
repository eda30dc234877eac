"""random_map: randomness keyed by (seed, stage, element index) only."""

from __future__ import annotations

import numpy as np
import pytest

import chute
from chute.testing import assert_equal_output_after_checkpoint


def noise(x: int, rng: np.random.Generator) -> tuple[int, float]:
    return x, float(rng.random())


def test_same_seed_same_draws_any_threads() -> None:
    ds = chute.MapDataset.range(300).shuffle(seed=1).random_map(noise, seed=9)
    ref = list(ds.to_iter_dataset(chute.ReadOptions(num_threads=0)))
    for threads in (1, 2, 7):
        got = list(
            ds.to_iter_dataset(chute.ReadOptions(num_threads=threads, prefetch_buffer_size=13))
        )
        assert got == ref


def test_draw_depends_on_index_not_on_access_order() -> None:
    ds = chute.MapDataset.range(50).random_map(noise, seed=3)
    forward = [ds[i] for i in range(50)]
    backward = [ds[i] for i in reversed(range(50))][::-1]
    assert forward == backward
    assert len({v for _, v in forward}) == 50


def test_epochs_and_seeds_and_stages_draw_differently() -> None:
    ds = chute.MapDataset.range(20).random_map(noise, seed=3).repeat(2)
    first, second = list(ds)[:20], list(ds)[20:]
    assert [x for x, _ in first] == [x for x, _ in second]
    assert [v for _, v in first] != [v for _, v in second]
    other = list(chute.MapDataset.range(20).random_map(noise, seed=4))
    assert [v for _, v in other] != [v for _, v in first]
    two = (
        chute.MapDataset.range(20)
        .seed(1)
        .random_map(noise)
        .random_map(lambda xv, rng: (xv[1], float(rng.random())))
    )
    assert all(a != b for a, b in two)


def test_random_map_transform_class_and_pipeline_seed() -> None:
    class Scale(chute.RandomMapTransform):
        def random_map(self, element: float, rng: np.random.Generator) -> float:
            return element * rng.uniform(0.8, 1.2)

    a = list(chute.MapDataset.range(1, 10).seed(5).random_map(Scale()))
    b = list(chute.MapDataset.range(1, 10).seed(5).random_map(Scale()))
    assert a == b and all(0.8 * x <= y <= 1.2 * x for x, y in zip(range(1, 10), a))
    with pytest.raises(ValueError, match=r"random_map has no seed.*ds\.seed\(42\)"):
        chute.MapDataset.range(3).random_map(noise)


def test_iter_random_map_is_keyed_by_position_and_restores() -> None:
    ds = (
        chute.MapDataset.range(40)
        .to_iter_dataset()
        .filter(lambda x: x % 3)
        .random_map(noise, seed=2)
    )
    assert list(ds) == list(ds)
    assert_equal_output_after_checkpoint(ds)
    assert_equal_output_after_checkpoint(
        chute.MapDataset.range(25).random_map(noise, seed=1).repeat(2)
    )
