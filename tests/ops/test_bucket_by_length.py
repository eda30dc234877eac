"""Length buckets as tf.data's `bucket_by_sequence_length`, with windows and exact resume."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def _sequences(lengths: list[int]) -> chute.MapDataset[dict[str, Any]]:
    return chute.MapDataset.source(lengths).map_with_index(
        lambda i, n: {"tokens": np.full(n, i + 1, np.int32), "id": i}
    )


def _length(x: dict[str, Any]) -> int:
    return len(x["tokens"])


def _tf_reference(lengths: list[int], bounds: list[int], sizes: list[int]) -> list[list[int]]:
    """tf.data's rule over one window: buckets fill in stream order; the rest at the end."""
    buckets: list[list[int]] = [[] for _ in sizes]
    out = []
    for i, n in enumerate(lengths):
        b = sum(n >= x for x in bounds)
        buckets[b].append(i)
        if len(buckets[b]) == sizes[b]:
            out.append(buckets[b])
            buckets[b] = []
    return out + [b for b in buckets if b]


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=100),
    bounds=st.lists(st.integers(1, 30), max_size=4, unique=True).map(sorted),
    sizes_seed=st.integers(1, 6),
    window=st.integers(1, 40),
)
@settings(max_examples=60, deadline=None)
def test_buckets_as_tf_within_each_window(
    lengths: list[int], bounds: list[int], sizes_seed: int, window: int
) -> None:
    sizes = [1 + (sizes_seed * (b + 3)) % 5 for b in range(len(bounds) + 1)]
    ds = (
        _sequences(lengths)
        .to_iter_dataset()
        .bucket_by_sequence_length(_length, bounds, sizes, window_size=window)
    )
    got = [b["id"].tolist() for b in ds]
    want: list[list[int]] = []
    for start in range(0, len(lengths), window):
        part = _tf_reference(lengths[start : start + window], bounds, sizes)
        want.extend([[start + i for i in b] for b in part])
    assert got == want


def test_one_window_is_tf_and_pads_to_the_boundary() -> None:
    lengths = [1, 5, 2, 9, 3, 6, 7, 12, 2]
    ds = _sequences(lengths).to_iter_dataset()
    out = list(ds.bucket_by_sequence_length(_length, [4, 8], [2, 2, 1]))
    assert [b["id"].tolist() for b in out] == _tf_reference(lengths, [4, 8], [2, 2, 1])
    assert [b["tokens"].shape[1] for b in out] == [2, 9, 6, 12, 3, 7]
    padded = list(
        _sequences([1, 5, 2, 6, 3])
        .to_iter_dataset()
        .bucket_by_sequence_length(
            _length, [4, 8], [2, 2, 1], pad_to_bucket_boundary=True, pad_value=-1
        )
    )
    assert [b["tokens"].shape for b in padded] == [(2, 3), (2, 7), (1, 3)]
    assert padded[0]["tokens"][0].tolist() == [1, -1, -1]


def test_drop_remainder_drops_the_last_windows_partial_batches_only() -> None:
    lengths = [1, 5] * 7  # window 6: each window has 3 + 3, buckets of 2 -> partials
    ds = _sequences(lengths).to_iter_dataset()
    kept = [
        b["id"].tolist() for b in ds.bucket_by_sequence_length(_length, [4], [2, 2], window_size=6)
    ]
    dropped = [
        b["id"].tolist()
        for b in ds.bucket_by_sequence_length(
            _length, [4], [2, 2], window_size=6, drop_remainder=True
        )
    ]
    assert kept[:4] == [[0, 2], [1, 3], [4], [5]]
    assert dropped == [b for b in kept if min(b) < 12] and [12, 13] not in dropped


def test_errors() -> None:
    ds = _sequences([3, 12]).to_iter_dataset()
    with pytest.raises(ValueError, match=r"3 bucket_batch_sizes for 1 bucket_boundaries.*give 2"):
        ds.bucket_by_sequence_length(_length, [4], [1, 2, 3])
    with pytest.raises(ValueError, match=r"must increase strictly"):
        ds.bucket_by_sequence_length(_length, [4, 4], [1, 2, 3])
    with pytest.raises(ValueError, match=r"a bucket batch size=0 is invalid"):
        ds.bucket_by_sequence_length(_length, [4], [1, 0])
    with pytest.raises(ValueError, match=r"input element 1 has length 12 >= the largest bucket"):
        list(ds.bucket_by_sequence_length(_length, [4, 8], [1, 1, 1], pad_to_bucket_boundary=True))
    with pytest.raises(ValueError, match="pass one of them"):
        ds.bucket_by_sequence_length(
            _length, [4], [1, 1], pad_to_bucket_boundary=True, batch_fn=list
        )


def test_restore_at_every_step_and_state_bounded() -> None:
    lengths = [(11 * i) % 29 + 1 for i in range(80)]
    ds = (
        _sequences(lengths)
        .repeat(2)
        .to_iter_dataset()
        .filter(lambda x: x["id"] % 5 != 2)
        .bucket_by_sequence_length(_length, [8, 16], [3, 4, 5], window_size=25, drop_remainder=True)
    )
    assert_equal_output_after_checkpoint(ds)
    it = iter(ds)
    for _ in range(4):
        next(it)
    assert len(json.dumps(it.get_state())) < 1000


def _workers(n: int) -> chute.IterDataset[Any]:
    lengths = [(13 * i) % 37 + 1 for i in range(300)]
    ds = (
        _sequences(lengths)
        .shuffle(seed=2)
        .to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=n))
    )
    return ds.bucket_by_sequence_length(_length, [10, 20, 30], [8, 6, 4, 2], window_size=50)


def test_same_batches_for_0_1_and_3_workers() -> None:
    reference = list(_workers(0))
    assert_trees_equal(list(_workers(1)), reference)
    assert_trees_equal(list(_workers(3)), reference)
    assert_equal_output_after_checkpoint(
        _workers(3), restore_into=_workers(0), steps=[0, 1, 9, 40, len(reference)]
    )
