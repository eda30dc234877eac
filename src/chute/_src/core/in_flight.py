"""What a source declares to the engine about the reads it wants in flight.

A source whose reads wait on something far away (a remote store: tens of milliseconds per
request, little CPU each) reads `reads in flight / latency` records per second, whatever
the CPU does. Its `__getitems__` of k indices is one concurrent fetch of k ranges, so what
counts is how many elements the reader asks for ahead, not how many threads ask. Such a
source declares it with an optional attribute:

- `reads_in_flight` (an int, 0 or more; 0 when absent): the elements a reader should
  compute ahead from its first chunk on. chute's remote file sources set it to
  `REMOTE_READS_IN_FLIGHT` when a file is a URL, and to 0 for local files (a local read
  costs CPU, which more reads in flight do not make faster).

`declared(source)` reads and checks it; the reader's executor takes the largest value under
a pipeline (`reads_in_flight` in `_src/exec/executors.py`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["MOST", "REMOTE_READS_IN_FLIGHT", "declared"]

REMOTE_READS_IN_FLIGHT = 256
"""What chute's remote file sources declare: at 20 ms a request, 256 reads in flight
are about 12,000 records/s, more than one process decodes."""

MOST = 4096
"""A declared value is capped here (the most elements AUTOTUNE computes ahead)."""


def declared(source: Any) -> int:
    """`source.reads_in_flight` (0 when it has none), checked."""
    n = getattr(source, "reads_in_flight", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(
            f"{type(source).__name__}.reads_in_flight is {n!r}: it must be an int, 0 or "
            "more (the elements a reader should compute ahead of the consumer from the "
            "start); leave it out, or return 0, for a source that is not latency-bound"
        )
    return min(n, MOST)
