"""`batch(..., pad_value=, padding_struct=)` for ragged elements, and `RebatchIterDataset`."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.experimental import RebatchIterDataset
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def _ragged(n: int) -> chute.MapDataset[Any]:
    return chute.MapDataset.range(n).map(
        lambda i: {"t": np.arange(i % 5 + 1), "img": np.ones((i % 3 + 1, 2)), "label": i}
    )


def test_pad_to_the_longest_in_each_batch() -> None:
    batches = list(_ragged(7).to_iter_dataset().batch(3, pad_value=-1))
    assert batches[0]["t"].tolist() == [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    assert batches[1]["t"].shape == (3, 5) and batches[2]["t"].shape == (1, 2)
    assert (
        batches[0]["img"].shape == (3, 3, 2) and batches[0]["img"][0, 1:].tolist() == [[-1, -1]] * 2
    )
    assert batches[0]["label"].tolist() == [0, 1, 2]


def test_pad_to_fixed_lengths_on_map_and_iter_datasets() -> None:
    fixed = {"t": 8, "img": 4}
    for ds in (
        _ragged(6).batch(3, padding_struct=fixed),
        _ragged(6).to_iter_dataset().batch(3, padding_struct=fixed),
    ):
        b = list(ds)[1]
        assert b["t"].shape == (3, 8) and b["img"].shape == (3, 4, 2)
        assert b["t"][0].tolist() == [0, 1, 2, 3, 0, 0, 0, 0]
    assert_equal_output_after_checkpoint(
        _ragged(10).to_iter_dataset().batch(4, padding_struct=fixed)
    )


def test_padding_never_cuts_and_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"element\['t'\] has length 3 > 2 from padding_struct"):
        list(_ragged(3).to_iter_dataset().batch(3, padding_struct={"t": 2}))
    with pytest.raises(ValueError, match="batch_fn= and pad_value="):
        # Both on purpose: the overloads of batch reject it for type checkers too.
        _ragged(3).batch(3, batch_fn=list, pad_value=0)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="lengths must be non-negative ints"):
        _ragged(3).batch(3, padding_struct={"t": -1})
    with pytest.raises(ValueError, match="cannot stack arrays of different shapes"):
        list(_ragged(3).to_iter_dataset().batch(3))


@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=12),
    new=st.integers(1, 7),
    drop=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_rebatch_keeps_every_row_in_order_and_restores(
    sizes: list[int], new: int, drop: bool
) -> None:
    starts = np.cumsum([0, *sizes])
    batches = [
        {"x": np.arange(a, b), "y": np.arange(a, b) * 2.0} for a, b in itertools.pairwise(starts)
    ]
    ds = RebatchIterDataset(
        chute.MapDataset.source(batches).to_iter_dataset(), new, drop_remainder=drop
    )
    out = list(ds)
    rows = np.concatenate([b["x"] for b in out]) if out else np.zeros(0, int)
    total = int(starts[-1])
    keep = total - total % new if drop else total
    assert rows.tolist() == list(range(keep))
    assert all(len(b["x"]) == new for b in out[:-1])
    assert_equal_output_after_checkpoint(ds)


def test_rebatch_across_epochs_and_errors() -> None:
    ds = chute.MapDataset.range(10).repeat(2).to_iter_dataset().batch(3)
    re = RebatchIterDataset(ds, 4)
    rows = list(range(10)) * 2
    assert_trees_equal([b.tolist() for b in re], [rows[i : i + 4] for i in range(0, 20, 4)])
    assert_equal_output_after_checkpoint(re)
    bad = chute.MapDataset.source([{"a": np.zeros(2), "b": np.zeros(3)}]).to_iter_dataset()
    with pytest.raises(ValueError, match=r"input 0 has leaves with leading sizes \[2, 3\]"):
        list(RebatchIterDataset(bad, 2))


def _workers(n: int) -> chute.IterDataset[Any]:
    rng = np.random.default_rng(1)
    seqs = [{"t": rng.integers(0, 9, size=int(rng.integers(1, 6)))} for _ in range(90)]
    ds = chute.MapDataset.source(seqs).shuffle(seed=2).batch(4, pad_value=-1).to_iter_dataset()
    ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=n))
    return RebatchIterDataset(ds.map(lambda b: b["t"][:, :1]), 3).batch(2, padding_struct=7)


def test_same_output_for_0_and_3_workers() -> None:
    assert_trees_equal(list(_workers(3)), list(_workers(0)))
    assert_equal_output_after_checkpoint(
        _workers(0), restore_into=_workers(3), steps=[0, 1, 7, 14, 15]
    )
