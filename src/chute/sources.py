"""Data sources: random-access readers that `MapDataset.source` and `DataLoader` read from."""

from chute._src.core.data_source import RandomAccessDataSource as RandomAccessDataSource
from chute._src.exec.mp.shared_memory import SharedMemoryDataSource as SharedMemoryDataSource
from chute._src.storage.formats.array_record import ArrayRecordDataSource as ArrayRecordDataSource
from chute._src.storage.formats.crec import RecordFileDataSource as RecordFileDataSource
from chute._src.storage.formats.jsonl import JsonlDataSource as JsonlDataSource
from chute._src.storage.formats.numpy_array import NumpyDataSource as NumpyDataSource
from chute._src.storage.formats.parquet import ParquetDataSource as ParquetDataSource
from chute._src.storage.formats.range import RangeDataSource as RangeDataSource
from chute._src.storage.formats.tfrecord import TFRecordDataSource as TFRecordDataSource

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
