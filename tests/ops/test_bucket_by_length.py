"""Length buckets as tf.data's `bucket_by_sequence_length`, open for the whole stream, with
exact resume."""

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


def _tf_reference(
    lengths: list[int],
    bounds: list[int],
    sizes: list[int],
    wait: int | None = None,
    drop: bool = False,
) -> list[list[int]]:
    """tf.data's rule: buckets fill in stream order, the partial ones come at the end in
    bucket order. With `wait`, a bucket whose first element was read `wait` elements ago
    is handed out before the next element is read. `drop` drops every short batch."""
    buckets: list[list[int]] = [[] for _ in sizes]
    out = []

    def hand_out(b: int) -> None:
        if len(buckets[b]) == sizes[b] or not drop:
            out.append(buckets[b])
        buckets[b] = []

    for i, n in enumerate(lengths):
        while wait is not None and any(buckets):
            b = min((b for b in range(len(sizes)) if buckets[b]), key=lambda b: buckets[b][0])
            if i - buckets[b][0] < wait:
                break
            hand_out(b)
        b = sum(n >= x for x in bounds)
        buckets[b].append(i)
        if len(buckets[b]) == sizes[b]:
            hand_out(b)
    for b in range(len(sizes)):
        if buckets[b]:
            hand_out(b)
    return out


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=100),
    bounds=st.lists(st.integers(1, 30), max_size=4, unique=True).map(sorted),
    sizes_seed=st.integers(1, 6),
    wait=st.none() | st.integers(1, 40),
    drop=st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_buckets_as_tf_over_the_whole_stream(
    lengths: list[int], bounds: list[int], sizes_seed: int, wait: int | None, drop: bool
) -> None:
    sizes = [1 + (sizes_seed * (b + 3)) % 5 for b in range(len(bounds) + 1)]
    ds = (
        _sequences(lengths)
        .to_iter_dataset()
        .bucket_by_sequence_length(_length, bounds, sizes, window_size=wait, drop_remainder=drop)
    )
    assert [b["id"].tolist() for b in ds] == _tf_reference(lengths, bounds, sizes, wait, drop)


@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=60),
    bounds=st.lists(st.integers(1, 30), max_size=3, unique=True).map(sorted),
    sizes_seed=st.integers(1, 6),
    wait=st.none() | st.integers(1, 20),
    drop=st.booleans(),
)
@settings(max_examples=30, deadline=None)
def test_restore_at_every_step_of_any_buckets(
    lengths: list[int], bounds: list[int], sizes_seed: int, wait: int | None, drop: bool
) -> None:
    sizes = [1 + (sizes_seed * (b + 2)) % 6 for b in range(len(bounds) + 1)]
    ds = (
        _sequences(lengths)
        .to_iter_dataset()
        .bucket_by_sequence_length(_length, bounds, sizes, window_size=wait, drop_remainder=drop)
    )
    assert_equal_output_after_checkpoint(ds)


def test_no_short_batch_before_the_end_of_the_stream() -> None:
    """Issue 47, defect 3: the buckets used to close at every window's end (16 x the sum of
    the batch sizes by default), handing out short batches mid-stream: under JAX, each a
    new shape to compile."""
    lengths = [(7 * i) % 23 + 1 for i in range(400)]
    sizes = [6, 5, 4]
    ds = _sequences(lengths).to_iter_dataset().bucket_by_sequence_length(_length, [8, 16], sizes)
    got = [b["id"].tolist() for b in ds]
    bucket = [sum(n >= x for x in [8, 16]) for n in lengths]
    full = [b for b in got if len(b) == sizes[bucket[b[0]]]]
    assert got[: len(full)] == full  # the short ones are the last, one per bucket at most
    assert sorted(i for b in got for i in b) == list(range(400))
    assert [len(b) for b in got[len(full) :]] == [2, 2]
    assert got == _tf_reference(lengths, [8, 16], sizes)


def test_tf_rule_and_pads_to_the_boundary() -> None:
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


def test_drop_remainder_drops_the_streams_final_remainder_only() -> None:
    lengths = [1, 5] * 7 + [1]  # buckets of 2 and 3: 8 short ones, 7 long ones
    ds = _sequences(lengths).to_iter_dataset()
    kept = [b["id"].tolist() for b in ds.bucket_by_sequence_length(_length, [4], [2, 3])]
    dropped = [
        b["id"].tolist()
        for b in ds.bucket_by_sequence_length(_length, [4], [2, 3], drop_remainder=True)
    ]
    assert kept == [[0, 2], [1, 3, 5], [4, 6], [8, 10], [7, 9, 11], [12, 14], [13]]
    assert dropped == kept[:-1]
    waited = [
        b["id"].tolist()
        for b in ds.bucket_by_sequence_length(
            _length, [4], [2, 3], window_size=4, drop_remainder=True
        )
    ]
    assert waited == [[0, 2], [4, 6], [8, 10], [12, 14]]  # the long ones never fill in time


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


def test_lengths_are_checked_and_numpy_ints_accepted() -> None:
    ds = _sequences([3, 12, 5]).to_iter_dataset()
    numpy_length: Any = lambda x: np.int64(len(x["tokens"]))  # noqa: E731
    as_numpy = ds.bucket_by_sequence_length(numpy_length, [4], [2, 2])
    assert [b["id"].tolist() for b in as_numpy] == [[1, 2], [0]]
    for bad in (-1, 2.5, "3", True):
        length: Any = lambda x, bad=bad: bad  # noqa: E731
        with pytest.raises(ValueError, match=rf"returned {bad!r} for input element 0: it must"):
            next(iter(ds.bucket_by_sequence_length(length, [4], [2, 2])))


def test_a_state_of_another_window_size_is_refused() -> None:
    ds = _sequences([3, 12, 5, 1]).to_iter_dataset()
    it = iter(ds.bucket_by_sequence_length(_length, [4], [2, 2], window_size=3))
    next(it)
    other = iter(ds.bucket_by_sequence_length(_length, [4], [2, 2]))
    with pytest.raises(chute.CheckpointError, match=r"window_size=None"):
        other.set_state(it.get_state())


@pytest.mark.parametrize(
    ("wait", "drop"), [(None, False), (None, True), (25, True), (7, False), (1, False)]
)
def test_restore_at_every_step_and_state_bounded(wait: int | None, drop: bool) -> None:
    lengths = [(11 * i) % 29 + 1 for i in range(80)] + [40]  # one long: waits to the end
    ds = (
        _sequences(lengths)
        .repeat(2)
        .to_iter_dataset()
        .filter(lambda x: x["id"] % 5 != 2)
        .bucket_by_sequence_length(
            _length, [8, 16, 30], [3, 4, 5, 2], window_size=wait, drop_remainder=drop
        )
    )
    assert_equal_output_after_checkpoint(ds)  # every step, and the state keeps its shape
    it = iter(ds)
    for _ in range(30):
        next(it)
        # However long an element has waited (the long one from the start), the state is
        # a position upstream and a few counts.
        state = it.get_state()
        assert len(json.dumps(state)) < 1000
        assert state["waiting"][3] <= 1 and len(state["waiting"]) == 4


def test_a_state_that_does_not_fit_the_stream_is_named() -> None:
    lengths = [(11 * i) % 29 + 1 for i in range(40)]
    ds = _sequences(lengths).to_iter_dataset().bucket_by_sequence_length(_length, [16], [3, 4])
    it = iter(ds)
    next(it)
    state = {k: v for k, v in it.get_state().items() if k != "checksum"}  # edited on purpose
    assert sum(state["waiting"]) > 0 and state["oldest"] < state["read"]
    fresh = iter(ds)
    for key, value, match in [
        ("waiting", [3, 0], r"\['waiting'\] = \[3, 0\] is invalid: .* below its batch size"),
        ("waiting", [0], r"for each of the 2 buckets"),
        ("oldest", state["read"] + 1, r"\['oldest'\] = .* is invalid"),
        ("oldest", state["read"], r"none waits exactly when it is 'read'"),
        ("waiting", [2, 3], r"bucket 0 gets 1 of elements|not among the elements waiting"),
        ("read", 10**6, r"the stream ends at element 40"),
    ]:
        with pytest.raises(chute.CheckpointError, match=match):
            fresh.set_state({**state, key: value})
    fresh.set_state(state)  # still restorable after the failed ones
    assert_trees_equal(list(fresh), list(it))


def _workers(n: int, wait: int | None) -> chute.IterDataset[Any]:
    lengths = [(13 * i) % 37 + 1 for i in range(300)]
    ds = (
        _sequences(lengths)
        .shuffle(seed=2)
        .to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=n))
    )
    return ds.bucket_by_sequence_length(_length, [10, 20, 30], [8, 6, 4, 2], window_size=wait)


@pytest.mark.parametrize("wait", [None, 50])
def test_same_batches_for_0_1_and_3_workers(wait: int | None) -> None:
    reference = list(_workers(0, wait))
    assert_trees_equal(list(_workers(1, wait)), reference)
    assert_trees_equal(list(_workers(3, wait)), reference)
    assert_equal_output_after_checkpoint(
        _workers(3, wait), restore_into=_workers(0, wait), steps=[0, 1, 9, 40, len(reference)]
    )
    assert_equal_output_after_checkpoint(
        _workers(0, wait), restore_into=_workers(2, wait), steps=[3, 17, len(reference) - 1]
    )
