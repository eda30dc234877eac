"""Direct reads of one-record chunks in ArrayRecord (Riegeli) files from a memory map.

An ArrayRecord file written with `group_size:1` stores each record in its own Riegeli
"simple" chunk. One scan of the chunk headers (cached beside the file) gives each
record's chunk data position; a read is then a slice of the map and, for zstd, one
decompression, with no C++ reader round trip. Layout (Riegeli records format): 64 KiB
blocks, each starting with a 24-byte block header that may interrupt a chunk; a chunk
is a 40-byte header (hash, data_size, data_hash, type + 7-byte record count,
decoded_data_size) then data. Simple-chunk data is a compression byte, a varint size
of the compressed record sizes, those sizes, then the values (for zstd prefixed by a
varint decompressed size).

Riegeli's chunk hashes (HighwayHash) are not computed here. Instead, when the index is
built, every record is read once through the C++ reader (which checks them) and the
CRC32C of each decoded record goes into the index; each direct read checks it.
"""

from __future__ import annotations

import mmap
import struct
from typing import Any

import numpy as np

from chute._src.storage.records.checksum import crc32c

__all__ = ["decode_record", "scan_single_record_chunks"]

BLOCK = 1 << 16
BLOCK_HEADER = 24
USABLE = BLOCK - BLOCK_HEADER
CHUNK_HEADER = 40
_SIMPLE = 0x72
_SIGNATURE = 0x73
_PADDING = 0x70
_METADATA = 0x6D
_HEADER = struct.Struct("<QQQQQ")
_MAX_DECODED = 2**62  # fits the int64 index


def _span(mm: Any, pos: int, size: int) -> tuple[bytes, int]:
    """`size` bytes of chunk content from file position `pos`, skipping block headers."""
    parts = []
    while size > 0:
        r = pos % BLOCK
        if r < BLOCK_HEADER:
            pos += BLOCK_HEADER - r
            r = BLOCK_HEADER
        n = min(size, BLOCK - r)
        parts.append(mm[pos : pos + n])
        pos += n
        size -= n
    return b"".join(parts), pos


def _chunk_end(begin: int, data_size: int, num_records: int) -> int:
    size = CHUNK_HEADER + data_size
    overhead = (size + (begin + USABLE - 1) % BLOCK) // USABLE
    end = begin + size + overhead * BLOCK_HEADER
    pos = begin + num_records
    remaining = BLOCK - 1 - (pos + BLOCK - 1) % BLOCK
    return max(end, pos + max(remaining - (USABLE - 1), 0))


def scan_single_record_chunks(mm: mmap.mmap | None, reader: Any, num_records: int) -> np.ndarray:
    """(data position, data size, decoded size, CRC32C) of each record, flattened.

    Returns an empty array when the file does not hold exactly `num_records`
    one-record simple chunks before its footer (other group sizes, transposed chunks):
    the caller then reads through the C++ reader.
    """
    none = np.zeros(0, dtype=np.int64)
    if mm is None or num_records == 0:
        return none
    size = len(mm)
    out = np.full(4 * num_records, -1, dtype=np.int64)
    pos = 0
    k = 0
    while pos < size and k < num_records:
        if pos + CHUNK_HEADER > size:
            return none
        header, data_pos = _span(mm, pos, CHUNK_HEADER)
        if len(header) != CHUNK_HEADER:
            return none
        _, data_size, _, type_and_count, decoded = _HEADER.unpack(header)
        chunk_type = type_and_count & 0xFF
        count = type_and_count >> 8
        if data_size > size or decoded > _MAX_DECODED:  # a corrupt header: leave it to C++
            return none
        if chunk_type == _SIMPLE:
            if count != 1:
                return none
            out[4 * k : 4 * k + 3] = (data_pos, data_size, decoded)
            k += 1
        elif chunk_type not in (_SIGNATURE, _PADDING, _METADATA) or count:
            return none
        pos = _chunk_end(pos, data_size, count)
    if k != num_records or pos > size:
        return none
    step = 4096
    try:
        for start in range(0, num_records, step):
            records = reader.read(start, min(start + step, num_records))
            out[4 * start + 3 : 4 * (start + len(records)) : 4] = [crc32c(r) for r in records]
    except (RuntimeError, ValueError):  # a corrupt chunk: leave reads to the C++ reader
        return none
    if (out[3::4] < 0).any():  # the reader returned fewer records than it counts
        return none
    return out


def _varint(data: bytes, p: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = data[p]
        p += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, p
        shift += 7
        if shift > 63:
            raise ValueError("a varint is longer than 10 bytes")


def decode_record(mm: Any, pos: int, size: int, decoded: int, crc: int, zstd: Any) -> bytes | None:
    """The record in the one-record chunk whose data is at `pos`; None if its
    compression is not none or zstd. Raises ValueError (IndexError wrapped) if bad."""
    r = pos % BLOCK
    data = (
        mm[pos : pos + size] if r >= BLOCK_HEADER and r + size <= BLOCK else _span(mm, pos, size)[0]
    )
    return _decode_chunk_data(data, decoded, crc, zstd)


def record_extent(pos: int, size: int) -> int:
    """The end of the bytes that hold a chunk's `size` data bytes from file position `pos`
    (its data and the block headers it may cross, at most)."""
    return pos + size + BLOCK_HEADER * (size // USABLE + 2)


class _Shifted:
    """Bytes read from file position `base` on, sliced by file positions."""

    __slots__ = ("base", "raw")

    def __init__(self, raw: bytes, base: int) -> None:
        self.raw = raw
        self.base = base

    def __getitem__(self, s: slice) -> bytes:
        return self.raw[s.start - self.base : s.stop - self.base]


def decode_record_from(
    raw: bytes, pos: int, size: int, decoded: int, crc: int, zstd: Any
) -> bytes | None:
    """`decode_record` on `raw`, the file's bytes from `pos` to `record_extent(pos, size)`
    (or to the end of the file)."""
    r = pos % BLOCK
    if r >= BLOCK_HEADER and r + size <= BLOCK:
        data = raw[:size]
    else:
        data = _span(_Shifted(raw, pos), pos, size)[0]
    if len(data) < size:
        raise ValueError("the chunk data ends early")
    return _decode_chunk_data(data, decoded, crc, zstd)


def _decode_chunk_data(data: bytes, decoded: int, crc: int, zstd: Any) -> bytes | None:
    try:
        compression = data[0]
        b = data[1]
        if b < 0x80:  # one-byte varint: the common case, inlined
            p = 2 + b
        else:
            sizes_size, p = _varint(data, 1)
            p += sizes_size
        if compression == 0x7A and zstd is not None:
            b = data[p]
            if b < 0x80:
                n = b
                p += 1
            else:
                n, p = _varint(data, p)
            if n != decoded:
                raise ValueError(f"the values say {n} bytes, the chunk header {decoded}")
            out = zstd.decompress(data[p:], max_output_size=n)
        elif compression == 0:
            out = data[p:]
        else:
            return None
    except IndexError:
        raise ValueError("the chunk data ends early") from None
    except ValueError:
        raise
    except Exception as e:  # zstandard.ZstdError
        raise ValueError(f"zstd could not decompress it ({e})") from None
    if len(out) != decoded:
        raise ValueError(f"it decoded to {len(out)} bytes, the chunk header says {decoded}")
    if crc32c(out) != crc:
        raise ValueError("its CRC32C differs from the one recorded when the file was indexed")
    return out
