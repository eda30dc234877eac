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

`declared(source)` reads and checks it. `reads_in_flight(ds)` is what a reader's executor
(`exec/executors.py`) reads when it chooses its first prefetch buffer: the largest value
any source under `ds` declares, found through the node protocol (`parents`, `role`, and a
`SOURCE` node's `data_source`: the user's object).
"""

from __future__ import annotations

from typing import Any

from chute._src.core import contract
from chute._src.core.node import walk

__all__ = ["MOST", "REMOTE_READS_IN_FLIGHT", "declared", "reads_in_flight"]

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


def reads_in_flight(ds: Any) -> int:
    """The most reads in flight that a source under the node `ds` declares (0: none)."""
    most = 0
    for node in walk(ds):
        source = contract.source_object(node)
        if source is not None:
            most = max(most, declared(source))
    return most
