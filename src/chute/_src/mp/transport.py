"""Moving results from a worker to the main process: a shared slab plus a control pipe.

The worker pickles a result with protocol 5. Every contiguous numpy array of at least
`min_shared_bytes` becomes an out-of-band buffer; the rest of the tree (and small arrays)
stays in the pickle. The worker copies the buffers of one result into one region of its
slab and sends a small header over the pipe: the pickle, the region's id and where each
buffer lies. The main process unpickles with the buffers given as views into the slab,
so the arrays it hands out are zero-copy.

The region is freed only when every array built on it has been garbage collected: all of
them are views of one `region` array (numpy collapses view chains to it), and a
`weakref.finalize` on that array queues the region id. The pool sends queued ids back to
the worker, whose allocator then reuses the space. A worker never waits for space: a
result that does not fit (the slab is full of results the consumer still holds, or it is
bigger than the slab) is sent through the pipe instead, as a copy.

Wire format, one `Connection.send_bytes` frame per item:

    worker -> main  header: pickle((kind, seq, body)), then, for layout "pipe", one raw
                    frame per buffer.
                    kind "ok":    body = (payload, layout), layout one of
                                  None, ("slab", region_id, offset, length, [(start, n)]),
                                  ("pipe", [n, ...])
                    kind "error": body = (pickled exception or None, traceback text,
                                  type name, message)
    main -> worker  b"T" + pickle((seq, task)) | b"F" + int64 region ids | b"S" (stop)
"""

from __future__ import annotations

import bisect
import mmap
import pickle
import traceback
import weakref
from array import array
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

__all__ = [
    "ALIGN",
    "DEFAULT_MIN_SHARED_BYTES",
    "RemoteFailure",
    "ResultReceiver",
    "ResultSender",
    "SlabAllocator",
    "decode_free",
    "encode_free",
]

ALIGN = 64
DEFAULT_MIN_SHARED_BYTES = 1024


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class SlabAllocator:
    """First-fit allocator over `[0, capacity)`, freeing in any order.

    Used by the worker alone; the main process only reports ids it is done with.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[tuple[int, int]] = [(0, capacity)] if capacity > 0 else []
        self._live: dict[int, tuple[int, int]] = {}
        self._next_id = 0

    def allocate(self, nbytes: int) -> tuple[int, int] | None:
        """Returns `(region_id, offset)` of `nbytes` (rounded up to `ALIGN`), or None."""
        n = _align(max(nbytes, 1))
        for i, (start, end) in enumerate(self._free):
            if end - start >= n:
                if end - start == n:
                    del self._free[i]
                else:
                    self._free[i] = (start + n, end)
                rid = self._next_id
                self._next_id += 1
                self._live[rid] = (start, n)
                return rid, start
        return None

    def free(self, region_id: int) -> None:
        start, n = self._live.pop(region_id)
        end = start + n
        i = bisect.bisect(self._free, (start, end))
        if i < len(self._free) and self._free[i][0] == end:
            end = self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][1] == start:
            i -= 1
            start = self._free.pop(i)[0]
        self._free.insert(i, (start, end))

    @property
    def live_regions(self) -> int:
        return len(self._live)


def encode_free(region_ids: list[int]) -> bytes:
    return b"F" + array("q", region_ids).tobytes()


def decode_free(frame: bytes) -> list[int]:
    return array("q", frame[1:]).tolist()


class ResultSender:
    """Worker side: sends results and errors to the main process."""

    def __init__(
        self,
        conn: Connection,
        slab: mmap.mmap | None,
        min_shared_bytes: int = DEFAULT_MIN_SHARED_BYTES,
    ) -> None:
        self._conn = conn
        self._view = memoryview(slab) if slab is not None else None
        self._allocator = SlabAllocator(len(slab) if slab is not None else 0)
        self._min = min_shared_bytes
        # Filled by the worker's receiving thread; drained here before each allocation.
        self.freed: deque[int] = deque()

    def send_result(self, seq: int, result: object) -> None:
        buffers: list[memoryview] = []

        def out_of_band(pb: pickle.PickleBuffer) -> bool:
            raw = pb.raw()
            if raw.nbytes < self._min:
                return True  # in-band
            buffers.append(raw)
            return False

        payload = pickle.dumps(result, protocol=5, buffer_callback=out_of_band)
        if not buffers:
            self._conn.send_bytes(pickle.dumps(("ok", seq, (payload, None)), protocol=5))
            return
        region = self._place(buffers)
        if region is not None:
            rid, offset, length, starts = region
            layout: tuple[Any, ...] = ("slab", rid, offset, length, starts)
            self._conn.send_bytes(pickle.dumps(("ok", seq, (payload, layout)), protocol=5))
            return
        sizes = [b.nbytes for b in buffers]
        self._conn.send_bytes(pickle.dumps(("ok", seq, (payload, ("pipe", sizes))), protocol=5))
        for b in buffers:
            self._conn.send_bytes(b)

    def _place(
        self, buffers: list[memoryview]
    ) -> tuple[int, int, int, list[tuple[int, int]]] | None:
        if self._view is None:
            return None
        while self.freed:
            self._allocator.free(self.freed.popleft())
        starts: list[tuple[int, int]] = []
        length = 0
        for b in buffers:
            starts.append((length, b.nbytes))
            length += _align(b.nbytes)
        got = self._allocator.allocate(length)
        if got is None:
            return None
        rid, offset = got
        view = self._view
        for (start, n), b in zip(starts, buffers):
            view[offset + start : offset + start + n] = b
        return rid, offset, length, starts

    def send_error(self, seq: int, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(exc))
        try:
            exc_bytes: bytes | None = pickle.dumps(exc, protocol=5)
        except Exception:
            exc_bytes = None
        body = (exc_bytes, tb, type(exc).__qualname__, str(exc))
        self._conn.send_bytes(pickle.dumps(("error", seq, body), protocol=5))


@dataclass(frozen=True)
class RemoteFailure:
    """An exception raised in a worker, as received by the main process."""

    seq: int
    exc_bytes: bytes | None
    traceback: str
    type_name: str
    message: str


class ResultReceiver:
    """Main side: receives one worker's messages and rebuilds results on its slab."""

    def __init__(self, conn: Connection, slab: mmap.mmap | None) -> None:
        self._conn = conn
        self._slab = slab
        # Region ids whose arrays are all gone, to be sent back to the worker.
        self.freed: deque[int] = deque()

    def recv(self) -> tuple[int, object] | RemoteFailure:
        """Blocks for the next message: `(seq, result)` or a `RemoteFailure`.

        Raises `EOFError`/`OSError` if the worker closed the pipe.
        """
        kind, seq, body = pickle.loads(self._conn.recv_bytes())
        if kind == "error":
            return RemoteFailure(seq, *body)
        payload, layout = body
        if layout is None:
            return seq, pickle.loads(payload)
        if layout[0] == "slab":
            return seq, pickle.loads(payload, buffers=self._slab_buffers(layout))
        return seq, pickle.loads(payload, buffers=self._pipe_buffers(layout[1]))

    def _slab_buffers(self, layout: tuple[Any, ...]) -> list[Any]:
        import numpy as np

        _, rid, offset, length, starts = layout
        # `region` is the one array every handed-out array is a view of: numpy stops
        # collapsing view chains at it because its base is the mmap, not an array.
        assert self._slab is not None, "a slab layout from a worker that has no slab"
        region = np.frombuffer(self._slab, dtype=np.uint8, count=length, offset=offset)
        fin = weakref.finalize(region, self.freed.append, rid)
        fin.atexit = False
        return [region[s : s + n] for s, n in starts]

    def _pipe_buffers(self, sizes: list[int]) -> list[Any]:
        import numpy as np

        out = []
        for n in sizes:
            buf = np.empty(n, dtype=np.uint8)
            got = self._conn.recv_bytes_into(buf)
            if got != n:
                raise EOFError(f"expected a {n}-byte buffer from the worker, got {got}")
            out.append(buf)
        return out
