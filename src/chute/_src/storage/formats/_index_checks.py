"""What each kind of cached index means, checked before a cache read from disk is used.

`_index_cache.cached_index` calls `index_is_valid(kind, index, size)` on every index it
reads from a cache file: every offset and length inside the data file, spans in order and
not overlapping, the counts consistent. These checks need no read of the data file, so
they cost a few numpy passes over the index. A kind without a check here is never cached.

An ArrayRecord index also holds the CRC32C of each record, which a read checks: a cache
would vouch for itself. `riegeli_spans_agree` reads a few records through the C++ reader
(which checks the file's own chunk hashes) and compares them with what the index decodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.storage.formats._riegeli import decode_record

__all__ = ["KINDS", "index_is_valid", "riegeli_spans_agree"]


def _within(values: np.ndarray, size: int) -> bool:
    return bool(np.all(values >= 0) and np.all(values <= size))


def _jsonl_lines(flat: np.ndarray, size: int) -> bool:
    """(start, end) of non-blank lines: 0 <= start < end <= size, a newline between lines."""
    if len(flat) % 2 or not _within(flat, size):
        return False
    s, e = flat[0::2], flat[1::2]
    return bool(np.all(e > s) and np.all(s[1:] > e[:-1]))


def _tfrecord(flat: np.ndarray, size: int) -> bool:
    """(data offset, length) pairs that tile the file: 12-byte head, data, 4-byte CRC."""
    if len(flat) % 2 or not _within(flat, size):
        return False
    if len(flat) == 0:
        return size == 0
    off, length = flat[0::2], flat[1::2]
    ends = off + length + 4
    return bool(off[0] == 12 and ends[-1] == size and np.all(off[1:] == ends[:-1] + 12))


def _arrayrecord_crc(flat: np.ndarray, size: int) -> bool:
    """(data position, data size, decoded size, CRC32C) of one-record chunks, in order;
    empty when the file is read through the C++ reader."""
    if len(flat) % 4:
        return False
    if len(flat) == 0:
        return True
    pos, dsize, decoded, crc = flat[0::4], flat[1::4], flat[2::4], flat[3::4]
    return bool(
        _within(pos, size)
        and _within(dsize, size)
        and np.all(pos + dsize <= size)
        and np.all(pos[1:] >= pos[:-1] + dsize[:-1])
        and np.all(decoded >= 0)
        and np.all(decoded < 1 << 40)
        and np.all(crc >= 0)
        and np.all(crc < 1 << 32)
    )


KINDS: dict[str, Callable[[np.ndarray, int], bool]] = {
    "jsonl-lines": _jsonl_lines,
    "tfrecord": _tfrecord,
    "arrayrecord-crc": _arrayrecord_crc,
}


def index_is_valid(kind: str, index: np.ndarray, size: int) -> bool:
    """Whether `index` (flattened int64) can be the `kind` index of a file of `size` bytes."""
    check = KINDS.get(kind)
    return check is not None and check(np.asarray(index, dtype=np.int64).ravel(), size)


def riegeli_spans_agree(mm: Any, reader: Any, spans: np.ndarray, zstd: Any) -> bool:
    """Whether a few records decoded through `spans` equal what the C++ reader reads:
    the first, the last and five spread between (a few microseconds each)."""
    n = len(spans) // 4
    if n == 0:
        return True
    for i in sorted({0, n - 1, *(n * k // 6 for k in range(1, 6))}):
        j = 4 * i
        try:
            mine = decode_record(
                mm, int(spans[j]), int(spans[j + 1]), int(spans[j + 2]), int(spans[j + 3]), zstd
            )
            theirs = reader.read(i, i + 1)
        except (ValueError, RuntimeError):
            return False
        if mine is not None and [mine] != list(theirs):
            return False
    return True
