"""`sequential_slice=True`: Grain's order of contiguous shares, one per worker or thread."""

from __future__ import annotations

from typing import Any

import pytest

import chute
from chute.experimental import InterleaveIterDataset, multithread_prefetch


def _mp(ds: chute.IterDataset[Any], workers: int) -> chute.IterDataset[Any]:
    options = chute.MultiprocessingOptions(num_workers=workers)
    return ds.mp_prefetch(options, sequential_slice=True)


def test_shares_are_contiguous_and_taken_in_turn() -> None:
    ds = chute.MapDataset.source(range(10)).to_iter_dataset()
    assert list(_mp(ds, 3)) == [0, 4, 7, 1, 5, 8, 2, 6, 9, 3]  # shares of 4, 3 and 3
    assert list(multithread_prefetch(ds, 3, 1, sequential_slice=True)) == list(_mp(ds, 3))
    r = chute.MapDataset.range(2, 21, 3).to_iter_dataset()
    assert list(_mp(r, 3)) == [2, 11, 17, 5, 14, 20, 8]
    # The stages above the reader run on each share: a batch holds one share's elements.
    batched = chute.MapDataset.range(8).to_iter_dataset().batch(3)
    assert [b.tolist() for b in _mp(batched, 2)] == [[0, 1, 2], [4, 5, 6], [3], [7]]


def test_the_order_depends_on_the_worker_count_only_with_the_flag() -> None:
    ds = chute.MapDataset.range(12).to_iter_dataset().map(lambda x: x * 10)
    for workers in (0, 1, 2, 3):
        plain = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
        assert list(plain) == list(range(0, 120, 10))
    assert list(_mp(ds, 1)) == list(range(0, 120, 10))  # one share: the whole


def test_sequential_shares_resume_exactly() -> None:
    ds = _mp(chute.MapDataset.range(11).to_iter_dataset(), 3)
    chute.experimental.assert_equal_output_after_checkpoint(ds)
    # A state of three shares does not restore into two.
    it = iter(ds)
    next(it)
    two = iter(_mp(chute.MapDataset.range(11).to_iter_dataset(), 2))
    with pytest.raises(chute.CheckpointError):
        two.set_state(it.get_state())


def test_an_interleave_gives_each_share_every_nth_input() -> None:
    inputs = [chute.MapDataset.range(10 * i, 10 * i + 2) for i in range(4)]
    ds = InterleaveIterDataset(inputs, cycle_length=1)
    assert list(_mp(ds, 2)) == [0, 10, 1, 11, 20, 30, 21, 31]  # inputs 0, 2 and 1, 3


def test_an_interleave_of_fewer_inputs_than_workers_leaves_a_share_empty() -> None:
    # A share with no input at all is an empty stream, whose state restores as any other
    # (its empty slots record no input's state).
    inputs = [chute.MapDataset.range(10 * i, 10 * i + 3) for i in range(2)]
    ds = InterleaveIterDataset(inputs, cycle_length=1)
    assert list(_mp(ds, 3)) == [0, 10, 1, 11, 2, 12]
    for k in range(7):
        it = iter(_mp(ds, 3))
        head = [next(it) for _ in range(k)]
        state = it.get_state()
        again = iter(_mp(ds, 3))
        again.set_state(state)
        assert head + list(again) == [0, 10, 1, 11, 2, 12]
        it.close()
        again.close()
    threads = multithread_prefetch(ds, 3, 1, sequential_slice=True)
    assert list(threads) == [0, 10, 1, 11, 2, 12]


def test_a_stream_that_cannot_be_divided_raises() -> None:
    stream = chute.IterDataset.source([1, 2, 3]).map(lambda x: x + 1)
    with pytest.raises(ValueError, match="Cannot slice `IterDataset` source"):
        _mp(stream, 2)
    with pytest.raises(ValueError, match="Cannot slice `IterDataset` source"):
        multithread_prefetch(stream, 2, 1, sequential_slice=True)
    endless = chute.MapDataset.range(5).repeat().to_iter_dataset()
    with pytest.raises(ValueError, match="repeats forever"):
        _mp(endless, 2)
