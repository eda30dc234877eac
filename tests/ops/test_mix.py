"""Mixing: MapDataset.mix / select_from_datasets / concatenate and IterDataset.mix."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def _tagged(tag: int, n: int) -> chute.MapDataset[Any]:
    return chute.MapDataset.range(n).map(lambda i: (tag, i))


def _constant(value: int) -> Callable[[int], int]:
    return lambda _: value


@given(weights=st.lists(st.integers(1, 9), min_size=1, max_size=4))
@settings(max_examples=30, deadline=None)
def test_realised_proportions_match_the_weights(weights: list[int]) -> None:
    # Grain's proportions: the smallest weight scaled to 100, the others truncated (3 and 4
    # are 100 and 133); exact for weights that are multiples of the smallest.
    scaled = [int(w * (100 / min(weights))) for w in weights]
    proportions = np.array(scaled) // math.gcd(*scaled)
    period = int(proportions.sum())
    n = 2 * period
    datasets = [chute.MapDataset.range(n).map(_constant(t)) for t in range(len(weights))]
    mixed = chute.MapDataset.mix(datasets, weights)
    head = mixed[: 2 * period]
    counts = np.bincount(list(head), minlength=len(weights))
    assert (counts == proportions * 2).all()
    iter_mixed = chute.IterDataset.mix([d.to_iter_dataset() for d in datasets], weights)
    assert list(itertools.islice(iter_mixed, 2 * period)) == list(head)


def test_fractional_weights_are_scaled_as_grain_scales_them() -> None:
    """0.7 and 0.3 are proportions 233 and 100 (the smallest scaled to 100, truncated), as
    in Grain, not 7 and 3: the mixture's length and order follow from them."""
    ds = chute.MapDataset.mix([_tagged(0, 4708), _tagged(1, 60_000)], [0.7, 0.3])
    assert len(ds) == 6728  # int(4708 / (233 / 333)); 7 and 3 would give 6725
    first_period = [ds[i][0] for i in range(333)]
    assert first_period.count(0) == 233
    assert [ds[i][0] for i in range(10)] == [0, 0, 0, 1, 0, 0, 1, 0, 0, 1]
    iter_ds = chute.IterDataset.mix(
        [_tagged(0, 4708).to_iter_dataset(), _tagged(1, 60_000).to_iter_dataset()], [0.7, 0.3]
    )
    assert [tag for tag, _ in itertools.islice(iter_ds, 333)] == first_period


def test_map_mix_is_deterministic_random_access_and_ends_with_the_first_dataset() -> None:
    ds = chute.MapDataset.mix([_tagged(0, 10), _tagged(1, 100)], [1, 3])
    assert len(ds) == 40
    assert [ds[i] for i in range(8)] == [
        (0, 0),
        (1, 0),
        (1, 1),
        (1, 2),
        (0, 1),
        (1, 3),
        (1, 4),
        (1, 5),
    ]
    assert list(ds) == [ds[i] for i in range(40)]
    shuffled = chute.MapDataset.mix(
        [_tagged(0, 10).shuffle(seed=1), _tagged(1, 30).shuffle(seed=2)]
    )
    out = list(shuffled)
    assert sorted(i for t, i in out if t == 0) == list(range(10))
    assert len({i for t, i in out if t == 1}) == 10 and len(out) == 20
    assert_equal_output_after_checkpoint(ds.repeat(2).to_iter_dataset())


def test_iter_mix_restores_at_every_step() -> None:
    a = chute.MapDataset.range(30).shuffle(seed=1).to_iter_dataset().filter(lambda x: x % 3 != 0)
    b = chute.MapDataset.range(100, 120).repeat(2).to_iter_dataset()
    assert_equal_output_after_checkpoint(chute.IterDataset.mix([a, b], [2, 1]))
    assert_equal_output_after_checkpoint(chute.IterDataset.mix({"a": a, "b": b}).batch(3))


def test_named_mixture_restores_after_its_weights_and_components_change() -> None:
    def parts() -> dict[str, chute.IterDataset[Any]]:
        return {
            "web": _tagged(0, 1000).to_iter_dataset(),
            "code": _tagged(1, 1000).to_iter_dataset(),
        }

    it = iter(chute.IterDataset.mix(parts(), {"web": 1, "code": 1}))
    seen = [next(it) for _ in range(10)]
    state = json.loads(json.dumps(it.get_state()))
    changed = parts() | {"books": _tagged(2, 1000).to_iter_dataset()}
    it2 = iter(chute.IterDataset.mix(changed, {"web": 1, "code": 3, "books": 1}))
    it2.set_state(state)
    rest = [next(it2) for _ in range(50)]
    for tag in (0, 1):
        done = max(i for t, i in seen if t == tag)
        assert next(i for t, i in rest if t == tag) == done + 1
    assert [i for t, i in rest if t == 2][:3] == [0, 1, 2]
    counts = np.bincount([t for t, _ in rest], minlength=3)
    assert counts.tolist() == [10, 30, 10]


def test_concatenate_and_select_from_datasets() -> None:
    ds = chute.MapDataset.concatenate([_tagged(0, 2), _tagged(1, 3)])
    assert list(ds) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert ds[5] == (0, 0) and len(ds) == 5
    shuffled = chute.MapDataset.concatenate(
        [chute.MapDataset.range(4).shuffle(seed=1), chute.MapDataset.range(4, 6)]
    ).repeat(2)
    epochs = list(shuffled)
    assert sorted(epochs[:6]) == sorted(epochs[6:]) == list(range(6))
    pick = chute.MapDataset.select_from_datasets([_tagged(0, 3), _tagged(1, 3)], [(1, 2), (0, 0)])
    assert list(pick) == [(1, 2), (0, 0)]
    assert_equal_output_after_checkpoint(pick.repeat(3).to_iter_dataset())
    assert_equal_output_after_checkpoint(
        chute.MapDataset.concatenate([_tagged(0, 5), _tagged(1, 4)]).to_iter_dataset()
    )


def test_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="weight 0 is invalid"):
        chute.MapDataset.mix([_tagged(0, 3), _tagged(1, 3)], [1, 0])
    with pytest.raises(ValueError, match="3 weights for 2 datasets"):
        chute.MapDataset.mix([_tagged(0, 3), _tagged(1, 3)], [1, 1, 1])
    with pytest.raises(TypeError, match="pass a non-empty list of MapDatasets"):
        # An IterDataset on purpose: the runtime check is what is tested.
        chute.MapDataset.mix([_tagged(0, 3).to_iter_dataset()])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is infinite"):
        chute.MapDataset.concatenate([_tagged(0, 3).repeat()])
    with pytest.raises(ValueError, match="do not match the datasets' names"):
        chute.IterDataset.mix({"a": _tagged(0, 3).to_iter_dataset()}, {"b": 1})
    with pytest.raises(IndexError, match="names dataset 5, but there are 1"):
        list(chute.MapDataset.select_from_datasets([_tagged(0, 3)], [(5, 0)]))
    it = iter(chute.IterDataset.mix([_tagged(0, 3).to_iter_dataset()]))
    with pytest.raises(chute.CheckpointError, match=r"state\['parents'\] is not a list of 1"):
        it.set_state({"stage": "mix", "index": 0, "parents": []})


def _workers(n: int) -> chute.IterDataset[Any]:
    a = chute.MapDataset.range(200).shuffle(seed=3).to_iter_dataset()
    b = chute.MapDataset.mix(
        [chute.MapDataset.range(1000, 1100), chute.MapDataset.range(2000, 2300)], [1, 2]
    ).to_iter_dataset()
    mixed = chute.IterDataset.mix({"a": a, "b": b}, {"a": 1, "b": 2})
    return mixed.mp_prefetch(chute.MultiprocessingOptions(num_workers=n))


def test_same_output_for_0_and_3_workers() -> None:
    assert_trees_equal(list(_workers(3)), list(_workers(0)))
    assert_equal_output_after_checkpoint(
        _workers(0), restore_into=_workers(3), max_elements=100, steps=[0, 1, 2, 50, 99]
    )
