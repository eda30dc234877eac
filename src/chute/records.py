"""Writing and checking chute's record format (`.crec`); read it with
`chute.sources.RecordFileDataSource`. The byte layout is in `_src/storage/records/FORMAT.md`."""

from chute._src.storage.records.adopt import write_manifest as write_manifest
from chute._src.storage.records.codecs import Compression as Compression
from chute._src.storage.records.verify import verify as verify
from chute._src.storage.records.writer import RecordWriter as RecordWriter
from chute._src.storage.records.writer import ShardedRecordWriter as ShardedRecordWriter

__all__ = ["Compression", "RecordWriter", "ShardedRecordWriter", "verify", "write_manifest"]
