"""`MapDataset.repeat(reseed_each_epoch=...)`, as Grain's."""

from __future__ import annotations

import numpy as np

import chute


def _draw(x: int, rng: np.random.Generator) -> int:
    return x * 100 + int(rng.integers(100))


def test_each_epoch_is_drawn_anew_unless_told_otherwise() -> None:
    ds = chute.MapDataset.range(50).seed(7).shuffle().random_map(_draw)
    anew = ds.repeat(3)
    epochs = [list(anew[i * 50 : (i + 1) * 50]) for i in range(3)]
    assert epochs[0] != epochs[1] and sorted(epochs[0]) != sorted(epochs[1])
    same = ds.repeat(3, reseed_each_epoch=False)
    assert list(same) == epochs[0] * 3
    forever = ds.repeat(reseed_each_epoch=False)
    assert forever._getitems(np.arange(100, 150)) == epochs[0]
    assert repr(same) == "RepeatMapDataset(num_epochs=3, reseed_each_epoch=False)"


def test_the_option_is_part_of_the_position() -> None:
    ds = chute.MapDataset.range(10).shuffle(seed=1)
    it = iter(ds.repeat(2).to_iter_dataset())
    next(it)
    state = it.get_state()
    other = iter(ds.repeat(2, reseed_each_epoch=False).to_iter_dataset())
    try:
        other.set_state(state)
    except chute.CheckpointError as e:
        assert "reseed_each_epoch=False" in str(e)
    else:
        raise AssertionError("a state of another repeat restored")
