"""Errors Grain raises, raised by chute too, with Grain's words in the message (code that
matches Grain's messages keeps working), beside chute's own explanation."""

import numpy as np
import pytest

import chute
from chute.experimental import (
    ConcatThenSplitIterDataset,
    FirstFitPackIterDataset,
    RebatchIterDataset,
    index_shuffle,
)

SAME_STRUCTURE = "Expected all input elements to have the same structure but got:"


@pytest.mark.parametrize(
    "elements",
    [
        [{"a": np.asarray([1, 2, 3])}, {"a": np.asarray([4, 5])}],
        [{"a": np.asarray([1, 2, 3])}, {"b": np.asarray(0.5)}],
        [[1, 2], [3, 4, 5]],
    ],
)
def test_batch_of_different_structures(elements: list) -> None:
    ds = chute.MapDataset.source(elements).batch(2)
    with pytest.raises(ValueError, match=SAME_STRUCTURE):
        ds[0]


def test_rebatch_of_an_empty_batch_raises() -> None:
    ds = chute.MapDataset.source([np.zeros((0, 3)), np.zeros((0, 3)), np.ones((4, 3))])
    it = iter(RebatchIterDataset(ds.to_iter_dataset(), batch_size=2))
    with pytest.raises(ValueError, match="starting batch size of 0 is not supported"):
        next(it)


@pytest.mark.parametrize("rounds", [2, 5, 1025, 4294967294])
def test_index_shuffle_rounds(rounds: int) -> None:
    with pytest.raises(ValueError, match="rounds must be an even integer between 4 and 1024"):
        index_shuffle(index=0, max_index=8, seed=3, rounds=rounds)
    with pytest.raises(ValueError, match=r"index must be in \[0, max_index\]"):
        index_shuffle(index=-1, max_index=8, seed=3, rounds=4)
    assert 0 <= index_shuffle(index=3, max_index=8, seed=3, rounds=1024) <= 8


@pytest.mark.parametrize("bad", [0, -1])
def test_packer_max_sequences_per_bin(bad: int) -> None:
    ds = chute.MapDataset.source([{"x": np.ones(2)}]).to_iter_dataset()
    with pytest.raises(ValueError, match=f"must be a positive integer, but got {bad}"):
        FirstFitPackIterDataset(
            ds, length_struct={"x": 4}, num_packing_bins=2, max_sequences_per_bin=bad
        )


def test_concat_then_split_missing_feature() -> None:
    ds = chute.MapDataset.source([{"x": np.ones(2), "y": np.ones(2)}]).to_iter_dataset()
    ds = ConcatThenSplitIterDataset(ds, length_struct={"x": 4})
    with pytest.raises(ValueError, match="Parent element has structure"):
        list(ds)


def test_mix_of_an_empty_dataset() -> None:
    empty = chute.MapDataset.range(0)
    with pytest.raises(
        ValueError,
        match=r"All datasets must have positive length for mixing, but dataset\(s\) at index 0 "
        r"\(RangeMapDataset\(start=0, stop=0, step=1\)\), index 2 \(RangeMapDataset\(start=0, "
        r"stop=0, step=1\)\) have length 0\.",
    ):
        chute.MapDataset.mix([empty, chute.MapDataset.range(3), empty], [1, 1, 1])


def test_thread_prefetch_negative_buffer() -> None:
    ds = chute.MapDataset.range(3).to_iter_dataset()
    with pytest.raises(ValueError, match="`prefetch_buffer_size` must be greater than or equal"):
        chute.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=-1)


class _Unpicklable:
    def __getstate__(self) -> dict:
        raise ValueError("not picklable")


class _HoldsUnpicklable(chute.transforms.Map):
    def __init__(self) -> None:
        self.state = _Unpicklable()

    def map(self, element: int) -> int:
        return element


def test_unpicklable_stage_named_in_grain_words() -> None:
    ds = chute.MapDataset.range(3).map(_HoldsUnpicklable()).to_iter_dataset()
    ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1))
    with pytest.raises(ValueError) as info:
        list(ds)
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "Dataset: MapMapDataset(transform=_HoldsUnpicklable) cannot be pickled!" in notes


def test_an_unpicklable_stage_moved_into_the_workers_is_named_as_written() -> None:
    # The map runs in the workers as a MapDataset stage; the error names the user's stage.
    ds = chute.MapDataset.range(3).to_iter_dataset().map(_HoldsUnpicklable())
    ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1))
    with pytest.raises(ValueError) as info:
        list(ds)
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "Dataset: MapIterDataset(transform=_HoldsUnpicklable) cannot be pickled!" in notes
    assert "stage MapIterDataset(transform=_HoldsUnpicklable) cannot be pickled" in notes


def test_slice_of_something_not_a_slice() -> None:
    for error in (TypeError, ValueError):  # Grain raises ValueError
        with pytest.raises(error, match=r"sl is not a slice: <class 'int'>"):
            chute.MapDataset.range(10).slice(5)  # type: ignore[arg-type]


class _DropAll(chute.transforms.Filter):
    def filter(self, element: int) -> bool:
        return False


def test_a_stream_filter_over_its_threshold_is_named_as_grain_names_it() -> None:
    ds = chute.MapDataset.range(1000).to_iter_dataset().filter(_DropAll())
    ds = chute.experimental.WithOptionsIterDataset(
        ds, chute.experimental.DatasetOptions(filter_raise_threshold_ratio=0.999)
    )
    with pytest.raises(
        ValueError,
        match=r"^Transformation FilterDatasetIterator\(transform=_DropAll\) skipped 100\.00 %",
    ):
        list(ds)
