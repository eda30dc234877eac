"""`ParquetIterDataset` and `TFRecordIterDataset`: the records of files, in order.

Each is `to_iter_dataset()` over the matching random-access source, so it checkpoints
as an index, runs under `mp_prefetch` and reads with threads like any reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chute._src.dataset import MapDataset
from chute._src.iter.prefetch import PrefetchIterDataset


class ParquetIterDataset(PrefetchIterDataset[dict[str, Any]]):
    """The rows of the Parquet file(s) at `path`, one dict of column values per row.

    `read_kwargs` may name `columns` to read only those.
    """

    def __init__(self, path: str | Sequence[str], **read_kwargs: Any) -> None:
        from chute._src.sources.parquet import ParquetDataSource

        columns = read_kwargs.pop("columns", None)
        if read_kwargs:
            raise TypeError(
                f"ParquetIterDataset: unsupported read options {sorted(read_kwargs)}: chute "
                "reads Parquet its own way and takes only columns=[...]; drop the others."
            )
        super().__init__(MapDataset.source(ParquetDataSource(path, columns)))


class TFRecordIterDataset(PrefetchIterDataset[bytes]):
    """The records of the TFRecord file at `path`, as bytes."""

    def __init__(self, path: str) -> None:
        from chute._src.sources.tfrecord import TFRecordDataSource

        super().__init__(MapDataset.source(TFRecordDataSource(path)))
