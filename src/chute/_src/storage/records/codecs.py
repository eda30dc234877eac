"""Optional zstd compression of records, with an optional trained dictionary."""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["Compression", "Decoder", "Encoder", "train_dictionary", "zstandard"]


class Compression(enum.Enum):
    """The compression `RecordWriter` tries on each record.

    A record is stored compressed only when that makes it smaller.
    """

    NONE = "none"
    ZSTD = "zstd"


def zstandard(who: str) -> Any:
    """Imports the `zstandard` package, or raises an ImportError naming the extra."""
    try:
        import zstandard as zstd
    except ImportError as e:  # pragma: no cover - zstandard is in the test extra
        raise ImportError(f"{who} needs zstandard: pip install 'chute[zstd]'") from e
    return zstd


def train_dictionary(samples: Sequence[bytes], size: int = 64 * 1024) -> bytes | None:
    """Trains a zstd dictionary on `samples`; None when they are too few or too alike."""
    zstd = zstandard("a trained zstd dictionary")
    total = sum(len(s) for s in samples)
    if len(samples) < 8 or total < 4 * 1024:
        return None
    size = max(1024, min(size, total // 4))
    try:
        return bytes(zstd.train_dictionary(size, list(samples)).as_bytes())
    except zstd.ZstdError:
        return None


class Encoder:
    """Compresses one record; keeps it raw when compression does not save space."""

    def __init__(self, level: int, dictionary: bytes | None) -> None:
        zstd = zstandard("RecordWriter(compression='zstd')")
        params = {"write_checksum": False, "write_content_size": True, "write_dict_id": False}
        self._plain = zstd.ZstdCompressor(level=level, **params)
        self._dict = None
        if dictionary:
            d = zstd.ZstdCompressionDict(dictionary)
            self._dict = zstd.ZstdCompressor(level=level, dict_data=d, **params)

    def encode(self, record: bytes) -> tuple[int, bytes]:
        """Returns (codec, stored bytes) for `record`."""
        from chute._src.storage.records.layout import Codec

        if self._dict is not None:
            packed = self._dict.compress(record)
            codec = Codec.ZSTD_DICT
        else:
            packed = self._plain.compress(record)
            codec = Codec.ZSTD
        if len(packed) < len(record):
            return codec, packed
        return Codec.RAW, record


class Decoder:
    """Decompresses records; one zstd context per thread, so it is thread-safe."""

    def __init__(self, dictionary: bytes | None) -> None:
        self._dictionary = dictionary
        self._local = threading.local()

    def _contexts(self) -> tuple[Any, Any]:
        ctx = getattr(self._local, "ctx", None)
        if ctx is None:
            zstd = zstandard("reading a compressed .crec record")
            plain = zstd.ZstdDecompressor()
            with_dict = None
            if self._dictionary:
                with_dict = zstd.ZstdDecompressor(
                    dict_data=zstd.ZstdCompressionDict(self._dictionary)
                )
            ctx = self._local.ctx = (plain, with_dict)
        return ctx

    def decode(self, codec: int, data: bytes | memoryview, raw_length: int) -> bytes:
        """Decompresses `data`; raises ValueError (wrapped by the caller) if it is bad."""
        plain, with_dict = self._contexts()
        ctx = with_dict if codec == 2 else plain
        if ctx is None:
            raise ValueError("the record needs the file's zstd dictionary, which is missing")
        try:
            out: bytes = ctx.decompress(data, max_output_size=raw_length)
        except Exception as e:  # zstandard.ZstdError, or a bad frame header
            raise ValueError(f"zstd could not decompress it ({e})") from None
        if len(out) != raw_length:
            raise ValueError(f"it decompressed to {len(out)} bytes, the index says {raw_length}")
        return out
