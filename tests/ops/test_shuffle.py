"""The global shuffle: a keyed bijection, per-epoch, pinned so it cannot drift."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute._src.core import contract
from chute.experimental import WindowShuffleIterDataset, WindowShuffleMapDataset
from chute.testing import assert_equal_output_after_checkpoint


def order(ds: chute.MapDataset[int]) -> list[int]:
    """The elements of `ds` in order, read in this thread: iterating a MapDataset directly
    would start (and stop) a pool of 16 threads, once per call of the loops below."""
    return list(ds.to_iter_dataset(chute.ReadOptions(num_threads=0)))


@given(n=st.integers(0, 3000), seed=st.integers(0, 2**64 - 1))
@settings(max_examples=60, deadline=None)
def test_shuffle_is_a_permutation(n: int, seed: int) -> None:
    out = order(chute.MapDataset.range(n).seed(seed).shuffle())  # shuffle(seed) is 32-bit
    assert sorted(out) == list(range(n))


def test_pinned_output() -> None:
    """Known-good output: a change here breaks every user's reproducibility."""
    assert list(chute.MapDataset.range(10).shuffle(seed=42)) == [2, 3, 5, 7, 1, 0, 8, 6, 9, 4]
    ds = chute.MapDataset.range(1000).shuffle(seed=0)
    assert [ds[i] for i in (0, 1, 2, 499, 999)] == [223, 200, 408, 866, 984]
    two_epochs = chute.MapDataset.range(6).shuffle(seed=5).repeat(2)
    assert list(two_epochs) == [1, 3, 5, 4, 2, 0, 5, 1, 4, 0, 2, 3]
    seeded = chute.MapDataset.range(8).seed(3).shuffle()
    assert list(seeded) == [1, 2, 6, 7, 5, 4, 3, 0]
    large = chute.MapDataset.range(1_000_003).shuffle(seed=7)  # the Feistel network
    assert [large[i] for i in (0, 1, 500_000, 1_000_002)] == [863312, 756604, 793576, 934839]


def test_each_epoch_is_shuffled_differently() -> None:
    ds = chute.MapDataset.range(100).shuffle(seed=1).repeat(3)
    epochs = [list(ds[e * 100 : (e + 1) * 100]) for e in range(3)]
    assert all(sorted(e) == list(range(100)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]


def test_epoch_seeds_are_mixed_not_added() -> None:
    """With seed + epoch, epoch 1 of seed 5 would equal epoch 0 of seed 6."""
    five = chute.MapDataset.range(100).shuffle(seed=5).repeat(2)
    six = chute.MapDataset.range(100).shuffle(seed=6)
    assert list(five[100:200]) != list(six)


def test_different_seeds_give_different_orders() -> None:
    orders = {tuple(order(chute.MapDataset.range(50).shuffle(seed=s))) for s in range(20)}
    assert len(orders) == 20


def test_shuffle_is_roughly_uniform() -> None:
    """Where element 0 lands over 4,000 seeds: every position of 8 gets its share."""
    counts = np.zeros(8, int)
    for seed in range(4000):
        counts[order(chute.MapDataset.range(8).shuffle(seed=seed)).index(0)] += 1
    assert counts.min() > 400 and counts.max() < 600, counts


def test_every_permutation_of_a_small_set_is_about_equally_likely() -> None:
    counts = Counter(tuple(order(chute.MapDataset.range(4).shuffle(seed=s))) for s in range(12_000))
    assert len(counts) == 24 and min(counts.values()) > 380 and max(counts.values()) < 620


def test_feistel_range_is_roughly_uniform() -> None:
    """Above the table size the Feistel network permutes: where does position 0 read?"""
    counts = np.zeros(8, int)
    for seed in range(2000):
        counts[chute.MapDataset.range(70_001).shuffle(seed=seed)[0] * 8 // 70_001] += 1
    assert counts.min() > 180 and counts.max() < 320, counts


def test_shuffle_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"shuffle has no seed.*ds\.seed\(42\)"):
        chute.MapDataset.range(5).shuffle()
    with pytest.raises(ValueError, match=r"seed=-1 is out of range"):
        chute.MapDataset.range(5).shuffle(seed=-1)
    with pytest.raises(TypeError, match=r"seed='1'.*must be an int"):
        chute.MapDataset.range(5).shuffle(seed="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"repeats forever.*shuffle before repeat"):
        chute.MapDataset.range(5).repeat().shuffle(seed=1)


def test_shuffle_checkpoints_across_epochs() -> None:
    assert_equal_output_after_checkpoint(chute.MapDataset.range(9).shuffle(seed=3).repeat(3))
    assert_equal_output_after_checkpoint(
        chute.MapDataset.range(40).shuffle(seed=1)[1::3].repeat(2).shuffle(seed=2)
    )


# Seeds as the user wrote them, in reprs, states and errors; states saved before that
# (the derived seed alone) still restore.

R0 = chute.ReadOptions(num_threads=0)


def _state_after(ds: chute.IterDataset[Any], k: int) -> dict[str, Any]:
    it = iter(ds)
    for _ in range(k):
        next(it)
    state: dict[str, Any] = json.loads(json.dumps(it.get_state()))
    return state


def test_a_shuffle_shows_the_seed_it_was_given() -> None:
    ds = chute.MapDataset.range(100).shuffle(seed=42)
    assert repr(ds) == "ShuffleMapDataset(seed=42)"
    state = _state_after(ds.batch(4).to_iter_dataset(R0), 3)
    assert state["pipeline"][1] == "Shuffle(seed=42 (derived 17532488217563185893))"
    inherited = chute.MapDataset.range(60).seed(7).shuffle()
    assert repr(inherited) == "ShuffleMapDataset(seed=ds.seed(7))"
    assert (
        contract.identity(inherited)[1] == "Shuffle(seed=ds.seed(7) (derived 1650069959653123811))"
    )
    rmap = chute.MapDataset.range(4).random_map(lambda x, rng: x, seed=5)
    assert "seed=5" in repr(rmap) and contract.identity(rmap)[1].startswith(
        "RandomMap(seed=5 (derived "
    )


def test_a_state_of_another_seed_is_refused_naming_both_seeds() -> None:
    one = _state_after(chute.MapDataset.range(30).shuffle(seed=1).to_iter_dataset(R0), 2)
    it = iter(chute.MapDataset.range(30).shuffle(seed=2).to_iter_dataset(R0))
    with pytest.raises(
        chute.CheckpointError,
        match=r"'Shuffle\(seed=1 \(derived \d+\)\)' in the state, but this pipeline has "
        r"'Shuffle\(seed=2 \(derived \d+\)\)'",
    ):
        it.set_state(one)


def _add_noise(x: int, rng: np.random.Generator) -> int:
    return int(x) * 1000 + int(rng.integers(0, 1000))


# States saved by chute before seeds were shown as given (at commit c72ae2f), with the
# pipelines that took them and how many elements had been read.
LEGACY: dict[str, tuple[Callable[[], chute.IterDataset[Any]], int, str]] = {
    "shuffle": (
        lambda: chute.MapDataset.range(100).shuffle(seed=42).batch(4).to_iter_dataset(R0),
        3,
        '{"stage":"to_iter_dataset","next_index":3,"pipeline":["Range(start=0, stop=100, '
        'step=1)","Shuffle(seed=17532488217563185893)","Batch(batch_size=4, '
        'drop_remainder=False)"]}',
    ),
    "shuffle_with_the_pipeline_seed": (
        lambda: (
            chute.MapDataset.range(60).seed(7).shuffle().map(lambda x: x * 2).to_iter_dataset(R0)
        ),
        5,
        '{"stage":"to_iter_dataset","next_index":5,"pipeline":["Range(start=0, stop=60, '
        'step=1)","Shuffle(seed=1650069959653123811)","Map()"]}',
    ),
    "window_shuffle": (
        lambda: WindowShuffleMapDataset(
            chute.MapDataset.range(50), window_size=8, seed=3
        ).to_iter_dataset(R0),
        4,
        '{"stage":"to_iter_dataset","next_index":4,"pipeline":["Range(start=0, stop=50, '
        'step=1)","WindowShuffle(window_size=8, seed=11658853342129813110)"]}',
    ),
    "random_map": (
        lambda: chute.MapDataset.range(30).random_map(_add_noise, seed=5).to_iter_dataset(R0),
        6,
        '{"stage":"to_iter_dataset","next_index":6,"pipeline":["Range(start=0, stop=30, '
        'step=1)","RandomMap(seed=2611768881034074630)"]}',
    ),
    "iter_window_shuffle": (
        lambda: WindowShuffleIterDataset(
            chute.MapDataset.range(40).to_iter_dataset(R0), window_size=5, seed=11
        ),
        7,
        '{"stage":"window_shuffle","skip":2,"piece":2,"window":1,"parent":{"stage":'
        '"to_iter_dataset","next_index":3,"pipeline":["Range(start=0, stop=40, step=1)"]}}',
    ),
    "iter_random_map": (
        lambda: chute.MapDataset.range(40).to_iter_dataset(R0).random_map(_add_noise, seed=9),
        3,
        '{"stage":"indexed_map","index":3,"params":"seed=7983132463724685211","parent":'
        '{"stage":"to_iter_dataset","next_index":3,"pipeline":["Range(start=0, stop=40, '
        'step=1)"]}}',
    ),
}


@pytest.mark.parametrize("name", list(LEGACY))
def test_a_state_saved_with_the_derived_seed_alone_still_restores(name: str) -> None:
    make, k, saved = LEGACY[name]
    expected = list(make())[k:]
    it = iter(make())
    it.set_state(json.loads(saved))
    assert _as_lists(list(it)) == _as_lists(expected)
    if "seed=" in saved:  # saved now with the seed as given
        assert _state_after(make(), k) != json.loads(saved)


def test_a_legacy_state_of_another_seed_is_still_refused() -> None:
    _, _, saved = LEGACY["shuffle"]
    other = chute.MapDataset.range(100).shuffle(seed=43).batch(4).to_iter_dataset(R0)
    it = iter(other)
    with pytest.raises(chute.CheckpointError, match=r"Shuffle\(seed=17532488217563185893\)"):
        it.set_state(json.loads(saved))


def _as_lists(xs: list[Any]) -> list[Any]:
    return [x.tolist() if isinstance(x, np.ndarray) else x for x in xs]
