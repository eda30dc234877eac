"""Grain's operations-API packer `PackAndBatchOperation`, on records and in a `DataLoader`,
and `BatchOperation`'s stacking as Grain's."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import chute
from chute.python import Record, RecordMetadata

SEQS = [
    {"inputs": [1, 2, 3], "targets": [10]},
    {"inputs": [4, 5], "targets": [20, 30, 40]},
    {"inputs": [6], "targets": [50, 60]},
    {"inputs": [7, 8, 9], "targets": [70, 80, 90]},
]


def _records(seqs: list[dict[str, Any]]) -> list[Record[Any]]:
    return [
        Record(RecordMetadata(index=i, record_key=i), {k: np.asarray(v) for k, v in s.items()})
        for i, s in enumerate(seqs)
    ]


def test_sequences_go_to_the_first_row_they_fit_and_a_full_batch_is_emitted() -> None:
    op = chute.experimental.PackAndBatchOperation(
        length_struct={"inputs": 4, "targets": 4}, batch_size=2
    )
    out = list(op(iter(_records(SEQS))))
    assert [r.metadata.index for r in out] == [2, 3]  # the last sequence of each batch
    assert all(r.metadata.record_key is None for r in out)
    data, segments, positions = out[0].data
    assert data["inputs"].tolist() == [[1, 2, 3, 6], [4, 5, 0, 0]]
    assert data["targets"].tolist() == [[10, 50, 60, 0], [20, 30, 40, 0]]
    assert segments["inputs"].tolist() == [[1, 1, 1, 2], [1, 1, 0, 0]]
    assert positions["targets"].tolist() == [[0, 0, 1, 0], [0, 1, 2, 0]]
    assert segments["inputs"].dtype == np.int32
    # The fourth fits no row of the first batch: it opens the second, whose other row is empty.
    data, segments, _ = out[1].data
    assert data["inputs"].tolist() == [[7, 8, 9, 0], [0, 0, 0, 0]]
    assert segments["targets"].tolist() == [[1, 1, 1, 0], [0, 0, 0, 0]]


def test_max_sequences_per_bin_and_trailing_axes() -> None:
    seqs = [{"x": np.full((n, 2), n)} for n in (1, 1, 1)]
    op = chute.experimental.PackAndBatchOperation(
        length_struct={"x": 5}, batch_size=2, max_sequences_per_bin=1
    )
    out = list(op(iter(_records(seqs))))
    assert len(out) == 2
    assert out[0].data[0]["x"].shape == (2, 5, 2)
    assert out[1].data[1]["x"].tolist() == [[1, 0, 0, 0, 0], [0, 0, 0, 0, 0]]


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match=r"length_struct\['x'\] = 0 is invalid"):
        chute.experimental.PackAndBatchOperation(length_struct={"x": 0}, batch_size=2)
    with pytest.raises(ValueError, match="batch_size=0 is invalid"):
        chute.experimental.PackAndBatchOperation(length_struct={"x": 3}, batch_size=0)
    op = chute.experimental.PackAndBatchOperation(length_struct={"x": 2}, batch_size=2)
    with pytest.raises(ValueError, match=r"element 1 is longer than a row \(\['x'\] has 3 > 2\)"):
        list(op(iter(_records([{"x": [1]}, {"x": [1, 2, 3]}]))))
    with pytest.raises(ValueError, match=r"element 0 has no feature \['x'\]"):
        list(op(iter(_records([{"y": [1]}]))))


class _Source:
    def __len__(self) -> int:
        return len(SEQS)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in SEQS[i].items()}


@pytest.mark.parametrize("worker_count", [0, 2])
def test_a_dataloader_packs_its_records_and_resumes_exactly(worker_count: int) -> None:
    loader = chute.DataLoader(
        data_source=_Source(),
        sampler=chute.IndexSampler(len(SEQS), num_epochs=3, shuffle=False),
        operations=[
            chute.experimental.PackAndBatchOperation(
                length_struct={"inputs": 4, "targets": 4}, batch_size=2
            )
        ],
        worker_count=worker_count,
    )
    batches = list(loader)
    expected = list(
        chute.experimental.PackAndBatchOperation(
            length_struct={"inputs": 4, "targets": 4}, batch_size=2
        )(iter(_records(SEQS * 3)))
    )
    assert len(batches) == len(expected)
    for got, want in zip(batches, expected):
        np.testing.assert_equal(got, want.data)
    for stop in range(len(batches)):
        it = iter(loader)
        for _ in range(stop):
            next(it)
        state = it.get_state()
        again = iter(loader)
        again.set_state(state)
        for got, want in zip(again, batches[stop:]):
            np.testing.assert_equal(got, want)


@dataclasses.dataclass
class _Point:
    x: int


def test_batch_operation_stacks_as_grain() -> None:
    op = chute.python.BatchOperation(batch_size=2)
    records = [Record(RecordMetadata(index=i), _Point(i)) for i in range(2)]
    (batch,) = op(iter(records))
    assert batch.data.dtype == object and batch.data.tolist() == [_Point(0), _Point(1)]
    ragged = [Record(RecordMetadata(index=0), [1, 2]), Record(RecordMetadata(index=1), [3])]
    with pytest.raises(TypeError, match=r"Record at position 0 has structure \[1, 2\], while"):
        list(op(iter(ragged)))
    keyed = [Record(RecordMetadata(index=0), {"a": 1}), Record(RecordMetadata(index=1), {"b": 1})]
    with pytest.raises(TypeError, match=r"records at positions \[1\] have structures"):
        list(op(iter(keyed)))
    # The same stacking in a pipeline.
    ds = chute.MapDataset.source([{"a": 1, "b": [2.0, 3.0]}] * 3).apply(op)
    assert ds[0]["a"].tolist() == [1, 1] and ds[1]["b"][1].tolist() == [3.0]
