"""Packers take a nested `length_struct`, as Grain's: a nested feature's leaves are packed
each by its own length and come out nested again; it must be a meta feature."""

from __future__ import annotations

import numpy as np
import pytest

import chute

ELEMENTS = [{"row": np.arange(3), "nested": {"inner": np.arange(2)}} for _ in range(5)]
LENGTHS = {"row": 10, "nested": {"inner": 10}}


@pytest.mark.parametrize(
    "packer",
    [chute.experimental.FirstFitPackIterDataset, chute.experimental.BestFitPackIterDataset],
)
def test_a_nested_meta_feature_is_packed_and_nested_again(packer: type) -> None:
    source = chute.MapDataset.source(ELEMENTS).to_iter_dataset()
    ds = packer(
        source,
        length_struct=LENGTHS,
        num_packing_bins=2,
        meta_features=["nested"],
        shuffle_bins=False,
    )
    rows = list(ds)
    assert sorted(rows[0]) == ["nested", "row", "row_positions", "row_segment_ids"]
    assert rows[0]["nested"]["inner"].tolist() == [0, 1, 0, 1, 0, 1, 0, 0, 0, 0]
    assert rows[0]["row"].tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert rows[0]["row_segment_ids"].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3, 0]
    assert [r["row_segment_ids"].max() for r in rows] == [3, 2]
    chute.experimental.assert_equal_output_after_checkpoint(ds)


def test_a_nested_feature_that_is_not_meta_is_refused_when_iterating() -> None:
    source = chute.MapDataset.source(ELEMENTS).to_iter_dataset()
    ds = chute.experimental.FirstFitPackIterDataset(
        source, length_struct=LENGTHS, num_packing_bins=2
    )
    with pytest.raises(ValueError, match=r"Failed to extract segment ids for 'nested'"):
        next(iter(ds))


def test_concat_then_split_still_takes_flat_features_only() -> None:
    source = chute.MapDataset.source(ELEMENTS).to_iter_dataset()
    with pytest.raises(ValueError, match=r"length_struct\['nested'\] = \{'inner': 10\}"):
        chute.experimental.ConcatThenSplitIterDataset(source, length_struct=LENGTHS)  # type: ignore[arg-type]
