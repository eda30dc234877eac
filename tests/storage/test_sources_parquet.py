"""ParquetDataSource through chute.sources (pyarrow is in the `test` extra)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chute import DataError
from chute.sources import ParquetDataSource

ROWS = [{"id": i, "text": f"row {i}", "score": i / 2} for i in range(250)]


def _write(path: Path, rows: list[dict[str, object]], row_group_size: int = 32) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def test_rows_as_dicts(tmp_path: Path) -> None:
    src = ParquetDataSource(_write(tmp_path / "a.parquet", ROWS), cache_bytes=1)  # evicts
    assert len(src) == 250
    order = [int(i) for i in np.random.default_rng(1).permutation(250)]
    assert src.__getitems__(order) == [ROWS[i] for i in order]
    assert src[-1] == ROWS[-1]
    only = ParquetDataSource(tmp_path / "a.parquet", columns=["text"])
    assert only[7] == {"text": "row 7"}


def test_many_files_and_pickle(tmp_path: Path) -> None:
    _write(tmp_path / "a.parquet", ROWS[:100])
    _write(tmp_path / "b.parquet", ROWS[100:], row_group_size=1000)
    src = ParquetDataSource(str(tmp_path / "*.parquet"))
    clone = pickle.loads(pickle.dumps(src))
    assert [clone[i] for i in range(250)] == ROWS
    assert repr(ParquetDataSource(tmp_path / "a.parquet", columns=["id"])).endswith(
        "columns=['id'])"
    )


def test_not_parquet(tmp_path: Path) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=r"x\.parquet: not a readable Parquet file"):
        len(ParquetDataSource(tmp_path / "x.parquet"))


def test_missing_pyarrow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    _write(tmp_path / "a.parquet", ROWS[:3])
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        ImportError, match=r"ParquetDataSource needs pyarrow: pip install 'chute\[parquet\]'"
    ):
        ParquetDataSource(tmp_path / "a.parquet")


def test_file_options_reach_pyarrow(tmp_path: Path) -> None:
    """Keyword options of `pyarrow.parquet.ParquetFile` are given to it for every file (and
    travel with the source when it is pickled); others are refused by name."""
    path = _write(tmp_path / "a.parquet", ROWS)
    mapped = ParquetDataSource(path, file_options={"memory_map": True, "buffer_size": 1024})
    assert pickle.loads(pickle.dumps(mapped))[3] == ROWS[3]
    # A limit too small for the file's own metadata: pyarrow refuses, so it was given.
    tiny = ParquetDataSource(path, file_options={"thrift_string_size_limit": 1})
    for source in (tiny, pickle.loads(pickle.dumps(tiny))):
        with pytest.raises(DataError, match="not a readable Parquet file"):
            len(source)
    with pytest.raises(
        TypeError, match=r"\['memmap'\] are not options of .*ParquetFile.*memory_map"
    ):
        ParquetDataSource(path, file_options={"memmap": True})


def test_parquet_iter_dataset_gives_read_kwargs_to_pyarrow(tmp_path: Path) -> None:
    import chute

    path = str(_write(tmp_path / "a.parquet", ROWS))
    ds = chute.experimental.ParquetIterDataset(path, memory_map=True, columns=["id"])
    assert [row["id"] for row in ds] == list(range(250)) and next(iter(ds)) == {"id": 0}
    with pytest.raises(TypeError, match=r"\['bogus'\] are not options of"):
        chute.experimental.ParquetIterDataset(path, bogus=1)
