"""`random_map` draws Grain's numbers: a Philox generator seeded with the stage's seed (or
Grain's default from the seeds set upstream), its counter at the element's index."""

from __future__ import annotations

import numpy as np

import chute


class _AddDigit(chute.RandomMapTransform):
    def random_map(self, element: int, rng: np.random.Generator) -> int:
        return element + int(rng.integers(0, 10))


def test_a_map_dataset_draws_grains_numbers() -> None:
    # The values of Grain's own cross-version test (map_test.py).
    ds = chute.MapDataset.range(10).seed(41).random_map(_AddDigit())
    assert list(ds) == [0, 6, 9, 5, 10, 14, 14, 13, 15, 13]
    # Any order of reading, threads or workers: the same numbers.
    assert [ds[i] for i in reversed(range(10))] == list(reversed(list(ds)))
    with_workers = ds.to_iter_dataset().mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    assert list(with_workers) == list(ds)


def test_an_iter_dataset_draws_grains_numbers_by_position() -> None:
    ds = chute.MapDataset.range(10).to_iter_dataset().random_map(_AddDigit(), seed=42)
    assert list(ds) == [9, 3, 6, 11, 4, 7, 9, 9, 8, 9]  # Grain's (map_test.py)
    chute.experimental.assert_equal_output_after_checkpoint(ds)


def test_the_default_seed_counts_each_seed_and_its_distance() -> None:
    base = chute.MapDataset.range(20)
    near = list(base.seed(1).random_map(_AddDigit()))
    assert near == list(base.seed(1).random_map(_AddDigit()))
    assert near != list(base.seed(1).map(lambda x: x).random_map(_AddDigit()))  # one further
    assert near != list(base.seed(2).random_map(_AddDigit()))
    timed = base.seed(1).random_map(_AddDigit())
    chute.config.update("py_debug_mode", True)
    try:  # stages wrapped for timing: no change of distance, so none of the numbers
        assert list(timed.to_iter_dataset()) == near
    finally:
        chute.config.update("py_debug_mode", False)
