"""Worker processes send chunks of one structure of same-shaped arrays as columns (one
array per leaf), and `batch` cuts and joins them: the output, the states and the batches'
memory are as with no workers, and everything that does not stack stays element by
element."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import chute
import mp_pipelines as mpp
from chute._src.core.columns import Columns
from chute._src.core.iterator import walk_iterators
from chute._src.exec.reader import PrefetchDatasetIterator


def pipeline(
    workers: int, fn: Any = mpp.uniform, batch: int | None = 48, drop: bool = False
) -> chute.IterDataset[Any]:
    ds: chute.IterDataset[Any] = (
        chute.MapDataset.range(700).shuffle(seed=4).map(fn).to_iter_dataset()
    )
    if batch is not None:
        ds = ds.batch(batch, drop_remainder=drop)
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))


def assert_same_lists(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for k, (x, y) in enumerate(zip(got, expected)):
        mpp.assert_exactly_equal(x, y, f"batch {k}")


@pytest.mark.parametrize("drop", [False, True])
def test_batches_of_columns_are_the_batches_without_workers(drop: bool) -> None:
    expected = mpp.as_list(pipeline(0, drop=drop))
    for workers in (1, 2):
        assert_same_lists(mpp.as_list(pipeline(workers, drop=drop)), expected)


def test_elements_one_by_one_are_the_elements_without_workers() -> None:
    expected = mpp.as_list(pipeline(0, batch=None))
    got = mpp.as_list(pipeline(2, batch=None))
    assert_same_lists(got, expected)
    assert all(x["ids"].flags.writeable for x in got)  # as a stage above may write them


def test_workers_send_columns_and_the_reader_hands_them_to_batch() -> None:
    it = iter(pipeline(2, batch=None))
    try:
        reader = next(i for i in walk_iterators(it) if isinstance(i, PrefetchDatasetIterator))
        kinds = [type(reader._next_columns(40)) for _ in range(15)]
    finally:
        it.close()
    # The first elements are computed here while the workers start (a list); then columns.
    assert Columns in kinds, kinds
    assert kinds[-1] is Columns


def test_chunks_that_do_not_stack_stay_lists_and_mix_with_columns() -> None:
    def ragged(workers: int) -> chute.IterDataset[Any]:
        # Uniform elements first, then ragged ones: batches of those need batch_fn.
        ds = chute.MapDataset.range(300).map(mpp.ragged_after_100).to_iter_dataset()
        return ds.batch(16, batch_fn=list).mp_prefetch(
            chute.MultiprocessingOptions(num_workers=workers)
        )

    assert_same_lists(mpp.as_list(ragged(2)), mpp.as_list(ragged(0)))
    filtered = [
        chute.MapDataset.range(700)
        .map(mpp.uniform)
        .filter(lambda x: int(x["ids"][0]) % 7 != 0)
        .to_iter_dataset()
        .batch(32)
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=w))
        for w in (0, 2)
    ]
    assert_same_lists(mpp.as_list(filtered[1]), mpp.as_list(filtered[0]))


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def test_a_batch_holds_its_own_memory_not_a_chunk() -> None:
    batches = mpp.as_list(pipeline(2, batch=100))
    for a, b in itertools.pairwise(batches):
        # Whatever a batch's arrays are views of holds that batch and no other elements.
        size = sum(x.nbytes for x in (a["ids"], *a["pair"], *a["list"]))
        assert _root(a["ids"]).nbytes <= size + 256
        a["ids"][:] = -1  # a batch is the user's to write; the next is untouched
        assert (b["ids"] >= 0).all()


@pytest.mark.parametrize(("taken_with", "restored_with"), [(2, 0), (0, 2), (2, 1)])
def test_states_taken_between_batches_of_columns_restore_with_any_worker_count(
    taken_with: int, restored_with: int
) -> None:
    expected = mpp.as_list(pipeline(0, batch=37))
    it = iter(pipeline(taken_with, batch=37))
    try:
        for _ in range(5):
            next(it)
        state = it.get_state()
    finally:
        it.close()
    again = iter(pipeline(restored_with, batch=37))
    try:
        again.set_state(state)
        assert_same_lists(list(again), expected[5:])
    finally:
        again.close()


def test_a_batch_fn_gets_the_elements() -> None:
    def build(workers: int) -> chute.IterDataset[Any]:
        ds = chute.MapDataset.range(200).map(mpp.uniform).to_iter_dataset()
        return ds.batch(24, batch_fn=list).mp_prefetch(
            chute.MultiprocessingOptions(num_workers=workers)
        )

    got = mpp.as_list(build(2))
    assert all(type(b) is list and len(b) in (24, 200 % 24) for b in got)
    assert_same_lists(got, mpp.as_list(build(0)))


def test_debug_mode_sees_the_same_batches_and_counts_their_elements() -> None:
    expected = mpp.as_list(pipeline(0))
    chute.config.update("py_debug_mode", True)
    try:
        it = iter(pipeline(2))
        got = list(it)
        stages = {st.name.split("(")[0]: st.elements for st in chute.stats(it).stages}
        it.close()
    finally:
        chute.config.update("py_debug_mode", False)
    assert_same_lists(got, expected)
    assert stages["PrefetchIterDataset"] == 700 and stages["BatchIterDataset"] == len(expected)
