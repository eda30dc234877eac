"""The byte layout of a `.crec` file: constants, header and trailer (see FORMAT.md)."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from chute._src.storage.records.checksum import crc32c

__all__ = [
    "HEADER",
    "HEADER_MAGIC",
    "INDEX_ENTRY_SIZE",
    "MAX_RECORD_SIZE",
    "TRAILER",
    "TRAILER_MAGIC",
    "VERSION",
    "Codec",
    "Header",
    "Trailer",
    "align_up",
]

VERSION = 1
HEADER_MAGIC = b"CHUTEREC"
TRAILER_MAGIC = b"CRECTAIL"
# magic, version, flags, alignment, reserved u64, reserved u32, header CRC32C.
HEADER = struct.Struct("<8sHHIQII")
# magic, version, flags, reserved, num_records, payload_end, index_offset,
# dict_offset, dict_length, meta_offset, meta_length, index/dict/meta/trailer CRC32C.
TRAILER = struct.Struct("<8sHHIQQQQQQQIIII")
# offsets u64, stored lengths u32, raw lengths u32, CRC32C u32, codec u8.
INDEX_ENTRY_SIZE = 8 + 4 + 4 + 4 + 1
MAX_RECORD_SIZE = 2**32 - 1
MAX_ALIGNMENT = 4096


class Codec(enum.IntEnum):
    """How one record's payload is stored."""

    RAW = 0
    ZSTD = 1
    ZSTD_DICT = 2


def align_up(n: int, alignment: int) -> int:
    """The smallest multiple of `alignment` that is >= n.

    >>> align_up(33, 8), align_up(32, 8)
    (40, 32)
    """
    return (n + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class Header:
    alignment: int

    def pack(self) -> bytes:
        body = HEADER.pack(HEADER_MAGIC, VERSION, 0, self.alignment, 0, 0, 0)
        return body[:-4] + struct.pack("<I", crc32c(body[:-4]))

    @property
    def payload_start(self) -> int:
        return align_up(HEADER.size, self.alignment)


@dataclass(frozen=True)
class Trailer:
    num_records: int
    payload_end: int
    index_offset: int
    dict_offset: int
    dict_length: int
    meta_offset: int
    meta_length: int
    index_crc: int
    dict_crc: int
    meta_crc: int

    def pack(self) -> bytes:
        body = TRAILER.pack(
            TRAILER_MAGIC,
            VERSION,
            0,
            0,
            self.num_records,
            self.payload_end,
            self.index_offset,
            self.dict_offset,
            self.dict_length,
            self.meta_offset,
            self.meta_length,
            self.index_crc,
            self.dict_crc,
            self.meta_crc,
            0,
        )
        return body[:-4] + struct.pack("<I", crc32c(body[:-4]))

    @property
    def crc(self) -> int:
        """The trailer's own CRC32C, which covers every other checksum in the file."""
        return int(struct.unpack("<I", self.pack()[-4:])[0])
