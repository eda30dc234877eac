"""`ParquetIterDataset` and `TFRecordIterDataset` (Grain's names): the records of files.

Each file is one shard, read by `to_iter_dataset()` over the matching random-access
source (so it checkpoints as an index, and under `mp_prefetch` its records are computed by
the workers in chunks of indices); several files are merged by the interleave rule
(`InterleaveIterDataset`). Grain's `ParquetIterDataset` interleaves several files 16 at a
time, and so does chute's, in the same order.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.errors import DataError
from chute._src.core.iterator import DatasetIterator
from chute._src.ops.interleave import InterleaveIterDataset
from chute._src.storage.formats._paths import expand_paths

_PARQUET_CYCLE = 16  # Grain's: files of a ParquetIterDataset read at a time


class ParquetIterDataset(InterleaveIterDataset):
    """The rows of the Parquet file(s) at `path`, one dict of column values per row.

    Several files are interleaved, 16 at a time (as Grain). `read_kwargs` go to
    `pyarrow.parquet.ParquetFile` for each file, as in Grain (`memory_map=True`, ...), but
    for `columns`, which selects the columns to read.
    """

    def __init__(self, path: str | os.PathLike[str] | Sequence[str], **read_kwargs: Any) -> None:
        from chute._src.storage.formats.parquet import ParquetDataSource

        columns = read_kwargs.pop("columns", None)
        files = expand_paths(path, "ParquetIterDataset")
        shards = [
            MapDataset.source(ParquetDataSource(p, columns, file_options=read_kwargs))
            for p in files
        ]
        super().__init__(shards, cycle_length=_PARQUET_CYCLE)


class TFRecordIterDataset(InterleaveIterDataset):
    """The records of the TFRecord file(s) at `path`, as bytes.

    Several files are read `cycle_length` at a time by the interleave rule (the default 1:
    one after the other). A file that is missing or corrupt raises where it is read (as
    in Grain): `FileNotFoundError`, or `chute.DataError` (a `ValueError`).
    """

    def __init__(
        self, path: str | os.PathLike[str] | Sequence[str], *, cycle_length: int = 1
    ) -> None:
        from chute._src.storage.formats.tfrecord import TFRecordDataSource

        where = "TFRecordIterDataset"
        given = [path] if isinstance(path, str | os.PathLike) else list(path)
        shards: list[MapDataset[Any] | IterDataset[Any]] = []
        for item in given:
            try:
                files = expand_paths(item, where)
                shards += [MapDataset.source(TFRecordDataSource(p)) for p in files]
            except (FileNotFoundError, DataError) as e:  # raised where it is read
                shards.append(_Unreadable(str(item), e))
        super().__init__(shards, cycle_length=cycle_length)


class _Unreadable(IterDataset[Any]):
    """A file that could not be opened: reading it raises why."""

    _role = StageRole.SOURCE

    def __init__(self, path: str, error: Exception) -> None:
        super().__init__()
        self._path = path
        self._error = error

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _Raising(self._error)

    def __repr__(self) -> str:
        return f"unreadable file {self._path!r}"

    def _fingerprint_params(self) -> str:
        return repr(self._path)


class _Raising(DatasetIterator[Any]):
    stage = "unreadable_file"

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self._error = error

    def __next__(self) -> Any:
        raise self._error.with_traceback(None)
