"""How many reads a pipeline's sources want in flight from its first chunk on.

A latency-bound source declares the elements a reader should compute ahead with a
`reads_in_flight` attribute (`_src/core/in_flight.py`). `reads_in_flight(ds)` is what a
reader's executor reads when it chooses its first prefetch buffer: the largest value any
source under `ds` declares, found through the node protocol (`parents`, `role`, and a
`SOURCE` node's `data_source`: the user's object).
"""

from __future__ import annotations

from typing import Any

from chute._src.core import contract
from chute._src.core.in_flight import MOST, REMOTE_READS_IN_FLIGHT, declared
from chute._src.core.node import walk

__all__ = ["MOST", "REMOTE_READS_IN_FLIGHT", "declared", "reads_in_flight"]


def reads_in_flight(ds: Any) -> int:
    """The most reads in flight that a source under the node `ds` declares (0: none)."""
    most = 0
    for node in walk(ds):
        source = contract.source_object(node)
        if source is not None:
            most = max(most, declared(source))
    return most
