"""Grain's `set_slice`: a source (or an interleave) changed in place to read one share."""

from __future__ import annotations

from pathlib import Path

import pytest

import chute
from chute._src.core.set_slice import SetSliceError
from chute._src.ops.source import RangeMapDataset, SourceMapDataset


def test_a_source_keeps_a_contiguous_share_of_what_it_was_made_with() -> None:
    ds = SourceMapDataset(list(range(10)))
    ds.set_slice(slice(0, None, 3), sequential_slice=True)  # 10 = 4 + 3 + 3
    assert list(ds) == [0, 1, 2, 3] and len(ds) == 4
    ds.set_slice(slice(2, None, 3), sequential_slice=True)  # of the whole, not of the share
    assert list(ds) == [7, 8, 9]
    assert ds[4] == 8  # positions past the end read later epochs, as for any source
    r = RangeMapDataset(2, 23, 2)  # 11 elements: 4 + 4 + 3
    r.set_slice(slice(1, None, 3), sequential_slice=True)
    assert list(r) == [10, 12, 14, 16]


def test_the_share_has_its_own_identity() -> None:
    ds = RangeMapDataset(12)
    whole = iter(ds.to_iter_dataset()).get_state()
    sliced = RangeMapDataset(12)
    sliced.set_slice(slice(1, None, 2), sequential_slice=True)
    it = iter(sliced.to_iter_dataset())
    with pytest.raises(chute.CheckpointError):
        it.set_state(whole)


def test_bad_calls_are_refused() -> None:
    ds = RangeMapDataset(10)
    with pytest.raises(AssertionError, match="sequential_slice=False is not supported"):
        ds.set_slice(slice(0, None, 2))
    with pytest.raises(ValueError, match=r"sl=slice\(3, None, 2\) is invalid"):
        ds.set_slice(slice(3, None, 2), sequential_slice=True)
    with pytest.raises(SetSliceError, match="is not a slice"):
        ds.set_slice(3, sequential_slice=True)  # type: ignore[arg-type]


def test_set_slice_is_refused_once_stages_are_built_on_the_dataset() -> None:
    ds = SourceMapDataset(list(range(10)))
    batched = ds.batch(4)  # it has read the length
    with pytest.raises(ValueError, match=r"a stage was already built on this dataset \(Batch"):
        ds.set_slice(slice(0, None, 2), sequential_slice=True)
    assert len(batched) == 3
    del batched
    ds.set_slice(slice(0, None, 2), sequential_slice=True)  # nothing is built on it now
    assert list(ds.batch(4)) and len(ds.batch(4)) == 2


def test_an_interleave_keeps_some_of_its_inputs() -> None:
    inputs = [chute.MapDataset.range(10 * i, 10 * i + 3) for i in range(4)]
    ds = chute.experimental.InterleaveIterDataset(inputs, cycle_length=3)
    ds.set_slice(slice(1, 3))
    assert list(ds) == [10, 20, 11, 21, 12, 22]
    ds.set_slice(slice(1, None))  # of the inputs it has now, as in Grain
    assert list(ds) == [20, 21, 22]
    chute.experimental.assert_equal_output_after_checkpoint(ds)


def test_parquet_files_are_sliced(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    paths = []
    for i in range(3):
        path = str(tmp_path / f"{i}.parquet")
        pq.write_table(pa.table({"x": [10 * i, 10 * i + 1]}), path)
        paths.append(path)
    ds = chute.experimental.ParquetIterDataset(paths)
    ds.set_slice(slice(1, 2))
    assert list(ds) == [{"x": 10}, {"x": 11}]
