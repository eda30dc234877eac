"""glibc's allocator in the processes that compute elements.

A stage that makes a fresh array for every element (decoding an image, `np.full`, a map's
temporaries) frees blocks of hundreds of KiB to MiBs, element after element. glibc serves
blocks above its mmap threshold (128 KiB at first) with `mmap`, and hands the memory of
freed ones back to the kernel, so the next element gets fresh pages and faults each one in:
64 JPEG decodes in a fresh process fault 14,000-21,000 pages, a third of their time. glibc
raises the threshold to the size of the largest block freed (up to 32 MiB; mallopt(3),
M_MMAP_THRESHOLD), but only as such blocks come and go, so a process's first elements pay
for it.

`keep_freed_memory`, in chute's worker processes only (`chute._src.process_effects`):
fixed thresholds (reuse freed blocks below 32 MiB, keep up to 128 MiB of free heap). A
worker's large outputs live in shared memory, so it may never free a block large enough to
raise the threshold by itself. The user's process is left as found: its allocator adjusts
itself as glibc does. Nothing is done where the C library is not glibc (musl, macOS).
"""

from __future__ import annotations

import os
from typing import Any

# glibc's mallopt parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_BELOW = 32 << 20
_TRIM_ABOVE = 128 << 20


def glibc() -> Any | None:
    """The C library (ctypes), if it is glibc; None otherwise."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError, AttributeError):  # not a glibc name on this system
        return None
    if not version or not version.startswith("glibc"):
        return None
    import ctypes

    return ctypes.CDLL(None)


def keep_freed_memory() -> None:
    """Lets glibc reuse freed blocks below 32 MiB instead of unmapping them, and keep up
    to 128 MiB of free heap mapped for reuse (in a worker process only)."""
    libc = glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_BELOW)
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE)
