"""Reprs Grain's tests compare, in Grain's words."""

import chute


def test_a_mixed_map_dataset_shows_its_inputs_and_selection_map() -> None:
    even, odd = chute.MapDataset.range(0, 10, 2), chute.MapDataset.range(1, 10, 2)
    # Grain's integer proportions, before their gcd: the smallest weight is 100.
    assert repr(chute.MapDataset.mix([even, odd], [0.4, 0.6])) == (
        "MixedMapDataset(parent_lengths=[5, 5], selection_map=SelectionWithProportionsMap("
        "proportions=(100, 150), length=8))"
    )
    assert repr(chute.MapDataset.mix([even, chute.MapDataset.range(3)])) == (
        "MixedMapDataset(parent_lengths=[5, 3], selection_map=SelectionWithProportionsMap("
        "proportions=(1, 1), length=6))"
    )
