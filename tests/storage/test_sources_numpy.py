"""NumpyDataSource through chute.sources."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from chute import DataError
from chute.sources import NumpyDataSource


def test_in_memory_rows() -> None:
    arr = np.arange(30, dtype=np.float32).reshape(10, 3)
    src = NumpyDataSource(arr)
    assert len(src) == 10
    np.testing.assert_array_equal(src[4], arr[4])
    got = src.__getitems__([9, 0, -1])
    np.testing.assert_array_equal(np.stack(got), arr[[9, 0, -1]])
    with pytest.raises(IndexError, match="out of range"):
        src.__getitems__([10])
    assert repr(src) == "NumpyDataSource([<array float32[10, 3]>])"


def test_npy_files_are_memory_mapped_and_concatenated(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.int64).reshape(4, 3)
    b = np.arange(100, 106, dtype=np.int64).reshape(2, 3)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    src = NumpyDataSource(str(tmp_path / "*.npy"))
    assert len(src) == 6
    both = np.concatenate([a, b])
    np.testing.assert_array_equal(np.stack(src.__getitems__(range(6))), both)
    clone = pickle.loads(pickle.dumps(src))
    np.testing.assert_array_equal(clone[5], b[1])
    mixed = NumpyDataSource([a, str(tmp_path / "b.npy")])
    np.testing.assert_array_equal(mixed[4], b[0])


def test_bad_npy_files(tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.zeros((100, 10)))
    data = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"t\.npy: not a readable \.npy file"):
        len(NumpyDataSource(tmp_path / "t.npy"))
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(DataError, match=r"o\.npy: .*Python objects"):
        len(NumpyDataSource(tmp_path / "o.npy"))
    np.save(tmp_path / "s.npy", np.float32(3))
    with pytest.raises(DataError, match="at least one dimension"):
        len(NumpyDataSource(tmp_path / "s.npy"))
