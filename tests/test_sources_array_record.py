"""ArrayRecordDataSource through chute.sources (the array-record extra is in `test`)."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from chute.sources import ArrayRecordDataSource

array_record_module = pytest.importorskip("array_record.python.array_record_module")

RECORDS = [b"record %d " % i * (1 + i % 7) for i in range(1000)]


def _write(path: Path, records: list[bytes], group_size: int) -> str:
    w = array_record_module.ArrayRecordWriter(str(path), f"group_size:{group_size}")
    for r in records:
        w.write(r)
    w.close()
    return str(path)


@pytest.mark.parametrize("group_size", [1, 64])
def test_random_access_single_and_batched(tmp_path: Path, group_size: int) -> None:
    src = ArrayRecordDataSource(
        _write(tmp_path / "a.array_record", RECORDS, group_size), chunk_cache_size=2
    )
    assert len(src) == 1000
    order = [int(i) for i in np.random.default_rng(0).permutation(1000)]
    assert [src[i] for i in order[:200]] == [RECORDS[i] for i in order[:200]]
    assert src.__getitems__(order) == [RECORDS[i] for i in order]
    assert src.__getitems__(order[:5]) == [RECORDS[i] for i in order[:5]]
    assert src[-1] == RECORDS[-1]


def test_many_files_threads_and_pickle(tmp_path: Path) -> None:
    paths = [
        _write(tmp_path / "a.array_record", RECORDS[:400], 1),
        _write(tmp_path / "b.array_record", RECORDS[400:], 16),
    ]
    src = ArrayRecordDataSource(paths)
    assert len(src) == 1000

    def check(seed: int) -> bool:
        order = np.random.default_rng(seed).permutation(1000)
        return all(src[int(i)] == RECORDS[i] for i in order)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(check, range(4)))
    clone = pickle.loads(pickle.dumps(src))
    assert clone.__getitems__(list(range(1000))) == RECORDS
    assert repr(clone) == f"ArrayRecordDataSource(<2 files: {paths[0]!r}, ...>)"


def test_reader_options_and_missing_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.array_record", RECORDS[:10], 1)
    assert (
        ArrayRecordDataSource([path], reader_options={"index_storage_option": "in_memory"})[9]
        == (RECORDS[9])
    )
    with pytest.raises(FileNotFoundError, match="no such file"):
        ArrayRecordDataSource(str(tmp_path / "missing.array_record"))
