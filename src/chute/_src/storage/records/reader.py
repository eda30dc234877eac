"""`CrecFile`: one memory-mapped `.crec` file, validated on open (see FORMAT.md)."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

import numpy as np

from chute._src.core.errors import DataError
from chute._src.storage.formats._open import open_data
from chute._src.storage.records.checksum import crc32c
from chute._src.storage.records.codecs import Decoder
from chute._src.storage.records.layout import (
    HEADER,
    HEADER_MAGIC,
    INDEX_ENTRY_SIZE,
    MAX_ALIGNMENT,
    TRAILER,
    TRAILER_MAGIC,
    VERSION,
    Codec,
)
from chute._src.storage.remote.urls import StorageOptions, display_url

__all__ = ["CrecFile"]

_FIX = "re-create it with `chute convert` or chute.records.RecordWriter, or restore a good copy"


class CrecFile:
    """An open, validated `.crec` file.

    Opening checks the header, the trailer, the index checksum and that every index
    entry points inside the payload region, so later reads cannot leave the file.
    `base` is the global index of this file's first record (for error messages).
    The file stays open (`guard`): `read` and `check` first make sure it has not shrunk
    since (a read from a truncated map would kill the process with SIGBUS): a flag test
    while the guard holds a lease, a size check otherwise (`_file_guard`).
    """

    def __init__(
        self,
        path: str,
        *,
        verify: bool = True,
        base: int = 0,
        storage_options: StorageOptions = None,
    ) -> None:
        self.path = display_url(path)  # in messages: no password
        self.verify = verify
        self.base = base
        # A local file is mapped; a remote one (a URL) is read by ranges, the same slices.
        self.guard = open_data(path, "a .crec file", storage_options)
        self.remote = self.guard.fd < 0
        size = self.guard.size
        try:
            if size == 0:
                raise self._error("the file is empty (0 bytes)", "it was never written")
            if size < HEADER.size + TRAILER.size:
                raise self._error(
                    f"the file has {size} bytes, less than a header and a trailer",
                    "it is truncated",
                )
            self.mm: Any = self.guard.mapping()
        except BaseException:
            self.guard.close()
            raise
        self.size = size
        try:
            self._validate()
        except BaseException:
            self.close()
            raise

    def _error(self, rule: str, cause: str, record: int | None = None) -> DataError:
        where = ""
        if record is not None:
            where = f" record {record}"
            if self.base:
                where += f" (global index {self.base + record})"
            where += ":"
        return DataError(f"{self.path}:{where} {rule}; {cause}; {_FIX}")

    def _regions(self, spans: list[tuple[int, int]]) -> list[memoryview]:
        """The bytes of each `(start, end)`: views of the map, or one batch of range reads."""
        if self.remote:
            return [memoryview(b) for b in self.mm.read_ranges(spans)]
        return [memoryview(self.mm)[a:b] for a, b in spans]

    def _validate(self) -> None:
        mm = self.mm
        tpos = self.size - TRAILER.size
        head, tail = self._regions([(0, HEADER.size), (tpos, self.size)])
        magic, version, _flags, alignment, _r1, _r2, header_crc = HEADER.unpack(head)
        if magic != HEADER_MAGIC:
            raise self._error(
                f"bad magic {magic!r} (a .crec file starts with {HEADER_MAGIC!r})",
                "this is not a chute record file or its header is corrupt",
            )
        if header_crc != crc32c(head[: HEADER.size - 4]):
            raise self._error("the header fails its CRC32C check", "the header is corrupt")
        if version != VERSION:
            raise DataError(
                f"{self.path}: .crec format version {version} is not supported by this chute "
                f"(it reads version {VERSION}); upgrade chute or re-create the file"
            )
        if alignment < 1 or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
            raise self._error(f"invalid alignment {alignment}", "the header is corrupt")
        fields = TRAILER.unpack(tail)
        if fields[0] != TRAILER_MAGIC:
            raise self._error(
                f"no trailer (the last {TRAILER.size} bytes do not start with {TRAILER_MAGIC!r})",
                "the file is truncated or was not closed by its writer",
            )
        if fields[-1] != crc32c(tail[: TRAILER.size - 4]):
            raise self._error("the trailer fails its CRC32C check", "the trailer is corrupt")
        (n, payload_end, index_offset, dict_offset, dict_length, meta_offset, meta_length) = fields[
            4:11
        ]
        index_crc, dict_crc, meta_crc = fields[11:14]
        payload_start = -(-HEADER.size // alignment) * alignment
        index_end = index_offset + n * INDEX_ENTRY_SIZE
        bad_region = (
            not payload_start <= payload_end <= tpos
            or index_end > tpos
            or dict_offset + dict_length > tpos
            or meta_offset + meta_length > tpos
            or index_offset < payload_end
        )
        if bad_region:
            raise self._error(
                "the trailer points outside the file (regions overlap or end past it)",
                "the file is truncated or corrupt",
            )
        index, d, meta = self._regions(
            [
                (index_offset, index_end),
                (dict_offset, dict_offset + dict_length),
                (meta_offset, meta_offset + meta_length),
            ]
        )
        if crc32c(index) != index_crc:
            index.release()
            raise self._error("the index fails its CRC32C check", "the index is corrupt")
        self.num_records = n
        o1 = n * 8
        o2 = o1 + n * 4
        o3 = o2 + n * 4
        o4 = o3 + n * 4
        self.offsets = index[:o1].cast("Q")
        self.lengths = index[o1:o2].cast("I")
        self.raw_lengths = index[o2:o3].cast("I")
        self.crcs = index[o3:o4].cast("I")
        self.codecs = index[o4:]
        self._index = index
        self.view = mm if self.remote else memoryview(mm)
        self._check_entries(payload_start, payload_end)
        self.dictionary: bytes | None = None
        if dict_length:
            if crc32c(d) != dict_crc:
                raise self._error(
                    "the zstd dictionary fails its CRC32C check", "the dictionary is corrupt"
                )
            self.dictionary = bytes(d)
        if crc32c(meta) != meta_crc:
            raise self._error("the metadata fails its CRC32C check", "the metadata is corrupt")
        try:
            self.metadata: dict[str, Any] = json.loads(bytes(meta)) if len(meta) else {}
        except ValueError:
            raise self._error("the metadata is not JSON", "the metadata is corrupt") from None
        self.decoder = Decoder(self.dictionary)
        self.payload_end = payload_end

    def _check_entries(self, start: int, end: int) -> None:
        n = self.num_records
        if n == 0:
            return
        offsets = np.frombuffer(self.offsets, dtype="<u8")
        lengths = np.frombuffer(self.lengths, dtype="<u4").astype(np.uint64)
        raw = np.frombuffer(self.raw_lengths, dtype="<u4")
        codecs = np.frombuffer(self.codecs, dtype=np.uint8)
        bad = (offsets < start) | (offsets > end) | (lengths > end - np.minimum(offsets, end))
        if bad.any():
            i = int(np.argmax(bad))
            raise self._error(
                f"the index points outside the payload region (offset {int(offsets[i])}, "
                f"length {int(lengths[i])}, payload region [{start}, {end}))",
                "the index is corrupt",
                record=i,
            )
        bad = codecs > max(Codec)
        bad |= (codecs == Codec.RAW) & (raw != lengths)
        if bad.any():
            i = int(np.argmax(bad))
            raise self._error(
                f"unknown codec {int(codecs[i])} or a raw length that differs from the stored one",
                "the index is corrupt",
                record=i,
            )

    def checksum_error(self, i: int, stored: int, computed: int) -> DataError:
        # A remote object replaced since it was opened is named as such, not as corrupt.
        return self.guard.explain(self._checksum_error(i, stored, computed))

    def _checksum_error(self, i: int, stored: int, computed: int) -> DataError:
        return self._error(
            f"the payload fails its CRC32C check (index says {stored:08x}, "
            f"data has {computed:08x})",
            "the payload is corrupt (`chute verify` checks a whole dataset)",
            record=i,
        )

    def decode_error(self, i: int, why: str) -> DataError:
        err = self._error(f"the compressed payload is bad: {why}", "the file is corrupt", i)
        return self.guard.explain(err)

    def shrunk_error(self, i: int) -> DataError:
        """The error for a file found shorter than when opened, at record `i`."""
        return self.guard.error(i)

    def read(self, i: int) -> bytes:
        """Record `i` (0 <= i < num_records) as bytes, checked and decompressed."""
        self.guard.check(i)
        return self.read_unguarded(i)

    def read_unguarded(self, i: int) -> bytes:
        """`read` without the size check, for a caller that made it for a block of reads."""
        # The body of `decode`, inlined: this is the per-record path of sharded datasets.
        o = self.offsets[i]
        data = self.mm[o : o + self.lengths[i]]
        if self.verify:
            c = crc32c(data)
            if c != self.crcs[i]:
                raise self.checksum_error(i, self.crcs[i], c)
        codec = self.codecs[i]
        if codec:
            try:
                return self.decoder.decode(codec, data, self.raw_lengths[i])
            except ValueError as e:
                raise self.decode_error(i, str(e)) from None
        return data

    def decode(self, i: int, data: bytes) -> bytes:
        """Record `i` from its stored payload `data`: checked, then decompressed."""
        if self.verify:
            c = crc32c(data)
            if c != self.crcs[i]:
                raise self.checksum_error(i, self.crcs[i], c)
        codec = self.codecs[i]
        if codec:
            try:
                return self.decoder.decode(codec, data, self.raw_lengths[i])
            except ValueError as e:
                raise self.decode_error(i, str(e)) from None
        return data

    def check(self, i: int) -> None:
        """Raises DataError if record `i` fails its checksum or does not decompress."""
        self.guard.check(i)
        o = self.offsets[i]
        data = self.view[o : o + self.lengths[i]]
        c = crc32c(data)
        if c != self.crcs[i]:
            raise self.checksum_error(i, self.crcs[i], c)
        if self.codecs[i]:
            try:
                self.decoder.decode(self.codecs[i], data, self.raw_lengths[i])
            except ValueError as e:
                raise self.decode_error(i, str(e)) from None

    def trailer_crc(self) -> int:
        return int(struct.unpack("<I", self.mm[self.size - 4 : self.size])[0])

    def close(self) -> None:
        for name in ("offsets", "lengths", "raw_lengths", "crcs", "codecs", "_index", "view"):
            v = self.__dict__.pop(name, None)
            if isinstance(v, memoryview):
                v.release()
        mm = self.__dict__.pop("mm", None)
        if mm is not None:
            # A caller may still hold a view; the mapping then closes when it is collected.
            with contextlib.suppress(BufferError):
                mm.close()
        guard = self.__dict__.get("guard")
        if guard is not None:
            guard.close()
