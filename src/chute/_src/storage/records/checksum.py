"""CRC32C (Castagnoli), the checksum of chute's formats: the one place that picks its code.

- `crc32c(data, value=0)`: the CRC32C of a C-contiguous bytes-like object, continuing
  from `value` (the CRC of the bytes before it; 0 to start).
- `read_checked(buffer, offset, length, crc)`: `buffer[offset:offset + length]` as bytes
  if its CRC32C is `crc`, else None, in one call; None itself when the native extension
  is not in use (a Python function doing both would cost more than slicing and comparing
  inline, which the caller then does).

Which code runs is decided once, at import, and `IMPLEMENTATION` says which in words:

- `chute._native`, a C extension (`src/chute/_native.c`) that `setup.py` builds when chute
  is installed from source with a C compiler. It uses the CPU's CRC32 instruction on
  x86-64 with SSE4.2 (checked at run time), else a table-driven loop. A call on a short
  record costs well under 100 ns.
- Otherwise the `crc32c` package (a dependency of chute), as fast on long inputs but
  about twice as costly per call on short ones.

The environment variable `CHUTE_CRC32C` overrides the choice: `auto` (the default, as
above), `package` (the `crc32c` package even when the extension is built) or `portable`
(the extension's table-driven code, to test it on a CPU that has the instruction; the
package if the extension is not built). Every setting gives the same checksums. Any other
value is an error where a checksum is first computed or checked (ValueError naming the
value and the settings), not at `import chute`.

>>> hex(crc32c(b"123456789"))
'0xe3069283'
>>> crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")
True
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import TypeAlias

__all__ = ["IMPLEMENTATION", "SETTINGS", "crc32c", "read_checked"]

BytesLike: TypeAlias = bytes | bytearray | memoryview | mmap.mmap
ReadChecked: TypeAlias = Callable[[BytesLike, int, int, int], bytes | None]
SETTINGS = ("auto", "package", "portable")


def _refuse(setting: str) -> tuple[Callable[..., int], ReadChecked, str]:
    """Functions that raise, for a `CHUTE_CRC32C` chute does not know: `import chute`
    succeeds, and the first checksum computed or checked (where the setting is used)
    raises ValueError naming the value and the settings it may take."""
    message = (
        f"CHUTE_CRC32C={setting!r} is not a CRC32C implementation chute knows; "
        f"set it to one of {', '.join(SETTINGS)}, or unset it"
    )

    def crc32c(data: BytesLike, value: int = 0) -> int:
        raise ValueError(message)

    def read_checked(buffer: BytesLike, offset: int, length: int, crc: int) -> bytes | None:
        raise ValueError(message)

    return crc32c, read_checked, f"none: {message}"


def _choose() -> tuple[Callable[..., int], ReadChecked | None, str]:
    setting = os.environ.get("CHUTE_CRC32C", "auto")
    if setting not in SETTINGS:
        return _refuse(setting)
    # The crc32c package is imported only when used: its import costs ~50 ms (it loads
    # importlib.metadata and its command line), paid by every worker process otherwise.
    try:
        from chute import _native
    except ImportError:
        import crc32c as package

        return package.crc32c, None, "crc32c package (the native extension is not built)"
    if setting == "package":
        import crc32c as package

        return package.crc32c, None, "crc32c package (CHUTE_CRC32C)"
    if setting == "portable":
        return _native.crc32c_portable, None, "native, table-driven (CHUTE_CRC32C=portable)"
    how = "SSE4.2 instruction" if _native.HARDWARE else "table-driven: no SSE4.2 on this CPU"
    return _native.crc32c, _native.read_checked, f"native, {how}"


crc32c, read_checked, IMPLEMENTATION = _choose()
