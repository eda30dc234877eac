"""CRC32C (Castagnoli), the checksum of chute's formats: the one place that picks its code.

- `crc32c(data, value=0)`: the CRC32C of a C-contiguous bytes-like object, continuing
  from `value` (the CRC of the bytes before it; 0 to start).
- `read_checked(buffer, offset, length, crc)`: `buffer[offset:offset + length]` as bytes
  if its CRC32C is `crc`, else None (the caller raises its own error).

Which code runs is decided once, at import, and `IMPLEMENTATION` says which in words:

- `chute._native`, a C extension (`src/chute/_native.c`) that `setup.py` builds when chute
  is installed from source with a C compiler. It uses the CPU's CRC32 instruction on
  x86-64 with SSE4.2 (checked at run time), else a table-driven loop. A call on a short
  record costs about 60 ns.
- Otherwise the `crc32c` package (a dependency of chute), which is as fast on long
  inputs but costs 2-4x as much per call; `read_checked` is then a slice and a compare.

The environment variable `CHUTE_CRC32C` overrides the choice: `auto` (the default, as
above), `package` (the `crc32c` package even when the extension is built) or `portable`
(the extension's table-driven code, to test it on a CPU that has the instruction; the
package if the extension is not built). Every value gives the same checksums.

>>> hex(crc32c(b"123456789"))
'0xe3069283'
>>> crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")
True
>>> read_checked(b"..abc..", 2, 3, crc32c(b"abc")), read_checked(b"..abc..", 2, 3, 0)
(b'abc', None)
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import TypeAlias

import crc32c as _package

__all__ = ["IMPLEMENTATION", "SETTINGS", "crc32c", "read_checked"]

BytesLike: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
SETTINGS = ("auto", "package", "portable")


def _checked_slice(
    crc_fn: Callable[[BytesLike], int],
) -> Callable[[BytesLike, int, int, int], bytes | None]:
    def read_checked(buffer: BytesLike, offset: int, length: int, crc: int) -> bytes | None:
        data = bytes(buffer[offset : offset + length])
        return data if crc_fn(data) == crc else None

    return read_checked


def _choose() -> tuple[Callable[..., int], Callable[[BytesLike, int, int, int], bytes | None], str]:
    setting = os.environ.get("CHUTE_CRC32C", "auto")
    if setting not in SETTINGS:
        raise ValueError(
            f"CHUTE_CRC32C={setting!r} is not a CRC32C implementation chute knows; "
            f"set it to one of {', '.join(SETTINGS)}, or unset it"
        )
    try:
        from chute import _native
    except ImportError:
        why = "the native extension is not built"
        return _package.crc32c, _checked_slice(_package.crc32c), f"crc32c package ({why})"
    if setting == "package":
        return _package.crc32c, _checked_slice(_package.crc32c), "crc32c package (CHUTE_CRC32C)"
    if setting == "portable":
        fn = _native.crc32c_portable
        return fn, _checked_slice(fn), "native, table-driven (CHUTE_CRC32C=portable)"
    how = "SSE4.2 instruction" if _native.HARDWARE else "table-driven: no SSE4.2 on this CPU"
    return _native.crc32c, _native.read_checked, f"native, {how}"


crc32c, read_checked, IMPLEMENTATION = _choose()
