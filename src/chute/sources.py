"""Data sources: random-access readers that `MapDataset.source` and `DataLoader` read from."""

from chute._src.sources.protocol import RandomAccessDataSource as RandomAccessDataSource
from chute._src.sources.range import RangeDataSource as RangeDataSource

__all__ = ["RandomAccessDataSource", "RangeDataSource"]
from chute._src.sources.crec import RecordFileDataSource as RecordFileDataSource

__all__ += ["RecordFileDataSource"]
