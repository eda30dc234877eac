"""Data sources: random-access readers that `MapDataset.source` and `DataLoader` read from."""

from chute._src.shared_memory import SharedMemoryDataSource as SharedMemoryDataSource
from chute._src.sources.array_record import ArrayRecordDataSource as ArrayRecordDataSource
from chute._src.sources.crec import RecordFileDataSource as RecordFileDataSource
from chute._src.sources.jsonl import JsonlDataSource as JsonlDataSource
from chute._src.sources.numpy_array import NumpyDataSource as NumpyDataSource
from chute._src.sources.parquet import ParquetDataSource as ParquetDataSource
from chute._src.sources.protocol import RandomAccessDataSource as RandomAccessDataSource
from chute._src.sources.range import RangeDataSource as RangeDataSource
from chute._src.sources.tfrecord import TFRecordDataSource as TFRecordDataSource

__all__ = [
    "ArrayRecordDataSource",
    "JsonlDataSource",
    "NumpyDataSource",
    "ParquetDataSource",
    "RandomAccessDataSource",
    "RangeDataSource",
    "RecordFileDataSource",
    "SharedMemoryDataSource",
    "TFRecordDataSource",
]
