"""`FetchAhead`: results pulled to the consumer's node while the consumer is busy.

Ray moves an object to the node that asks for it only when asked: a chunk computed on
another node would cross the network when the reader reaches it, and the consumer would
wait for the copy (~1 ms for a 100 KiB chunk, ~100 ms for 64 MiB on one machine's
loopback). A thread of the consumer's process keeps a `ray.wait(..., fetch_local=True)`
pending on the results asked for and not yet here, so each is pulled as soon as it is
computed. What it pulls is what was asked for (`max_chunks_in_flight`): the memory bound
on the consumer's node is unchanged.
"""

from __future__ import annotations

import threading
from typing import Any

_WAIT_S = 0.05  # how long one wait lasts before results sent since are added to it


class FetchAhead:
    """Pulls the results of `add`ed refs to this node, until `drop`ped or pulled."""

    def __init__(self, ray: Any) -> None:
        self._ray = ray
        self._refs: dict[Any, None] = {}
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, ref: Any) -> None:
        self._refs[ref] = None
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chute-ray-fetch", daemon=True)
            self._thread.start()
        self._wake.set()

    def drop(self, ref: Any) -> None:
        self._refs.pop(ref, None)

    def close(self) -> None:
        self._closed = True
        self._refs.clear()
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            refs = list(self._refs)  # one C call: atomic beside the consumer's changes
            if not refs:
                self._wake.wait(_WAIT_S)
                self._wake.clear()
                continue
            try:
                here, _ = self._ray.wait(
                    refs, num_returns=len(refs), timeout=_WAIT_S, fetch_local=True
                )
            except Exception:
                return  # Ray is shutting down
            for ref in here:
                self._refs.pop(ref, None)
