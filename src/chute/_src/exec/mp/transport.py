"""Moving results from a worker to the main process: a shared slab plus a control pipe.

The worker pickles a result with protocol 5. Every contiguous numpy array of at least
`min_shared_bytes` becomes an out-of-band buffer; the rest of the tree (and small arrays)
stays in the pickle. The worker copies the buffers of one result into one region of its
slab and sends a small header over the pipe: the pickle, the region's id and where each
buffer lies. The main process unpickles with the buffers given as views into the slab,
so the arrays it hands out are zero-copy.

A stage can also build a large array in the slab in the first place
(`ResultSender.allocate_array`, reached through `chute._src.core.outbuf.empty`; `batch`
stacks into it): such a buffer is sent where it lies, with no copy, as a region of its own.

The region is freed only when every array built on it has been garbage collected: all of
them are views of one `region` array (numpy collapses view chains to it), and a
`weakref.finalize` on that array queues the region id. The pool sends queued ids back to
the worker, whose allocator then reuses the space. A worker never waits for space: a
result that does not fit (the slab is full of results the consumer still holds, or it is
bigger than the slab) is sent through the pipe instead, as a copy.

Wire format, one `Connection.send_bytes` frame per item:

    worker -> main  header: pickle((kind, seq, body)), then, for layout "pipe", one raw
                    frame per buffer.
                    kind "ok":    body = (payload, layout, payload_at): payload is the
                                  pickle, or None when it lies in the slab at
                                  payload_at = (region_id, offset, length) (a pickle
                                  of at least PIPE_BYTES, freed once unpickled); layout
                                  one of
                                  None,
                                  ("slab", [(region_id, offset, length), ...],
                                           [(region_index, start, n), ...]),
                                  ("pipe", [n, ...])
                    kind "error": body = (pickled exception or None, traceback text,
                                  type name, message)
                    kind "slab":  body = (slab id, size), then the new slab's fd
                                  (SCM_RIGHTS); later regions are in that slab
                    kind "warn":  body = a message for the main process to warn with
    main -> worker  b"T" + seq (8 bytes) + pickle(task) | b"F" + int64 region ids
                    | b"S" (stop)
"""

from __future__ import annotations

import bisect
import mmap
import os
import pickle
import threading
import traceback
import weakref
from array import array
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

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
PIPE_BYTES = 16 << 10
"""A result's pickle of this many bytes or more goes through the slab, not the pipe (whose
buffer holds 64 KiB on Linux: a larger frame holds the worker until it is read)."""


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


# A region id is (slab id << _SLAB_SHIFT) | the id the slab's allocator gave it.
_SLAB_SHIFT = 40


class _Slab:
    """One mapped slab on the worker side, with its allocator."""

    def __init__(self, slab_id: int, mapping: mmap.mmap) -> None:
        self.id = slab_id
        self.mapping = mapping
        self.view = memoryview(mapping)
        self.allocator = SlabAllocator(len(mapping))
        self.address = _address(self.view)

    def close(self) -> None:
        self.view.release()
        self.mapping.close()


def _address(buffer: memoryview) -> int:
    """The address of a buffer's first byte."""
    import numpy as np

    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data) if buffer.nbytes else 0


class ResultSender:
    """Worker side: sends results and errors to the main process.

    With `grow_to` above the first slab's size (and `shm_dir` given), a result that needs
    more than 1/`headroom` of the slab makes the worker replace its slab by one
    `headroom` times the result (at most `grow_to`), so that `headroom` such results fit;
    while the current slab still holds the result, the new one is made after it is sent.

    `allocate_array` gives out arrays in the slab itself. Each is a region of its own,
    "built": while no result has carried it, the worker frees it as soon as its arrays are
    collected. A result that contains it carries it without a copy, and from then on it
    is "handed over": freed when both the main process and the worker have let go of it.
    """

    def __init__(
        self,
        conn: Connection,
        slab: mmap.mmap | None,
        min_shared_bytes: int = DEFAULT_MIN_SHARED_BYTES,
        *,
        grow_to: int = 0,
        shm_dir: str | None = None,
        headroom: int = 4,
    ) -> None:
        self._conn = conn
        self._current = _Slab(0, slab) if slab is not None else None
        self._retired: dict[int, _Slab] = {}
        self._min = min_shared_bytes
        self._grow_to = grow_to if shm_dir is not None else 0
        self._shm_dir = shm_dir
        self._headroom = headroom
        self._grow_after = 0  # a result's size whose larger slab is made after its send
        # Filled by the worker's receiving thread; drained here before each allocation.
        self.freed: deque[int] = deque()
        # Regions of `allocate_array`: built ones by id -> (offset, end) in their slab;
        # handed over ones by id -> how many of (main process, worker) still hold it.
        self._built: dict[int, tuple[int, int]] = {}
        self._handed: dict[int, int] = {}
        self._collected: deque[int] = deque()  # ids whose worker-side arrays are gone
        self._lock = threading.Lock()  # allocation and sending may come from two threads

    @property
    def slab_bytes(self) -> int:
        return len(self._current.mapping) if self._current is not None else 0

    def live_regions(self) -> int:
        slabs = [*self._retired.values(), *([self._current] if self._current else [])]
        return sum(s.allocator.live_regions for s in slabs)

    def allocate_array(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray | None:
        """An uninitialized C-contiguous array in the slab, or None if it has no room.

        A result holding it (or a contiguous view of it) is sent without copying it.
        """
        import numpy as np

        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        with self._lock:
            self._release_freed()
            slab = self._current
            got = None
            if nbytes * self._headroom > self.slab_bytes and self.slab_bytes < self._grow_to:
                got = self._fits_now(nbytes)
                if got is None:
                    slab = self._grow(nbytes)
            if got is None:
                got = slab.allocator.allocate(nbytes) if slab is not None else None
            if slab is None or got is None:
                return None
            local, offset = got
            rid = (slab.id << _SLAB_SHIFT) | local
            region = np.frombuffer(slab.mapping, dtype=np.uint8, count=nbytes, offset=offset)
            self._built[rid] = (offset, offset + nbytes)
        fin = weakref.finalize(region, self._collected.append, rid)
        fin.atexit = False
        return region.view(dtype).reshape(shape)

    def send_result(self, seq: int, result: object) -> None:
        with self._lock:
            self._send_result(seq, result)

    def _send_result(self, seq: int, result: object) -> None:
        buffers: list[memoryview] = []

        def out_of_band(pb: pickle.PickleBuffer) -> bool:
            raw = pb.raw()
            if raw.nbytes < self._min:
                return True  # in-band
            buffers.append(raw)
            return False

        payload = pickle.dumps(result, protocol=5, buffer_callback=out_of_band)
        layout: tuple[Any, ...] | None = None
        if buffers:
            self._release_freed()
            carried = self._carried(buffers) if self._built and self._current else {}
            layout = self._place(buffers, carried)
            if layout is None:
                layout = ("pipe", [b.nbytes for b in buffers])
            else:
                for rid in {rid for rid, _ in carried.values()}:
                    del self._built[rid]
                    self._handed[rid] = 2  # the main process and the worker hold it
        # A large pickle (many small elements) goes through the slab too: through the pipe,
        # it would block this worker until the main process reads it, which it does only
        # when it wants this result (results are consumed in order). Placed after the
        # buffers, in the slab the main process has once it reads this header.
        payload_at = self._place_payload(payload) if len(payload) >= PIPE_BYTES else None
        inline = payload if payload_at is None else None
        self._conn.send_bytes(pickle.dumps(("ok", seq, (inline, layout, payload_at)), protocol=5))
        if layout is not None and layout[0] == "pipe":
            for b in buffers:
                self._conn.send_bytes(b)
        wanted, self._grow_after = self._grow_after, 0
        if wanted * self._headroom > self.slab_bytes and self.slab_bytes < self._grow_to:
            self._grow(wanted)

    def _place_payload(self, payload: bytes) -> tuple[int, int, int] | None:
        """Copies `payload` into a region of its own in the current slab: (id, offset,
        length), or None where it has no room (it then goes through the pipe)."""
        self._release_freed()
        slab = self._current
        got = slab.allocator.allocate(len(payload)) if slab is not None else None
        if slab is None or got is None:
            return None
        local, offset = got
        slab.view[offset : offset + len(payload)] = payload
        return (slab.id << _SLAB_SHIFT) | local, offset, len(payload)

    def _fits_now(self, length: int) -> tuple[int, int] | None:
        """A region of `length` in the current slab when it still has room, the larger
        slab that results of this size want being made after this result is sent: making
        it (reserving and mapping `headroom` times the result, 77 MiB for a batch of 64
        images) would otherwise hold up the first result, which the consumer waits for."""
        if self._current is None:
            return None
        got = self._current.allocator.allocate(length)
        if got is not None:
            self._grow_after = max(self._grow_after, length)
        return got

    def _carried(self, buffers: list[memoryview]) -> dict[int, tuple[int, int]]:
        """Buffers that lie in a built region of the current slab: index -> (id, offset)."""
        assert self._current is not None
        slab = self._current
        out: dict[int, tuple[int, int]] = {}
        for i, b in enumerate(buffers):
            start = _address(b) - slab.address
            if not 0 <= start < len(slab.mapping):
                continue
            for rid, (r_start, r_end) in self._built.items():
                if r_start <= start and start + b.nbytes <= r_end and rid >> _SLAB_SHIFT == slab.id:
                    out[i] = (rid, start)
                    break
        return out

    def _release_freed(self) -> None:
        while self._collected:  # a worker-side `region` from allocate_array is gone
            rid = self._collected.popleft()
            if self._built.pop(rid, None) is None:
                self._let_go(rid)
                continue
            self._free(rid)
        while self.freed:  # the main process is done with a region
            rid = self.freed.popleft()
            if rid in self._handed:
                self._let_go(rid)
                continue
            self._free(rid)

    def _let_go(self, rid: int) -> None:
        self._handed[rid] -= 1
        if not self._handed[rid]:
            del self._handed[rid]
            self._free(rid)

    def _free(self, rid: int) -> None:
        slab_id, local = rid >> _SLAB_SHIFT, rid & ((1 << _SLAB_SHIFT) - 1)
        if self._current is not None and slab_id == self._current.id:
            self._current.allocator.free(local)
            return
        old = self._retired[slab_id]
        old.allocator.free(local)
        if old.allocator.live_regions == 0:
            del self._retired[slab_id]
            old.close()

    def _place(
        self, buffers: list[memoryview], carried: dict[int, tuple[int, int]]
    ) -> tuple[Any, ...] | None:
        """Copies the buffers not `carried` into one new region; the slab layout of all."""
        regions: list[tuple[int, int, int]] = []
        index_of: dict[int, int] = {}
        places: list[tuple[int, int, int]] = [(0, 0, 0)] * len(buffers)
        for i, (rid, offset) in carried.items():
            if rid not in index_of:
                r_start, r_end = self._built[rid]
                index_of[rid] = len(regions)
                regions.append((rid, r_start, r_end - r_start))
            region_index = index_of[rid]
            places[i] = (region_index, offset - regions[region_index][1], buffers[i].nbytes)
        copied = [i for i in range(len(buffers)) if i not in carried]
        if copied:
            length = 0
            for i in copied:
                places[i] = (len(regions), length, buffers[i].nbytes)
                length += _align(buffers[i].nbytes)
            slab = self._current
            grow = length * self._headroom > self.slab_bytes and self.slab_bytes < self._grow_to
            got = None
            if grow and not carried:  # carried regions must stay on the current slab
                got = self._fits_now(length)
                if got is None:
                    slab = self._grow(length)
            if got is None:
                got = slab.allocator.allocate(length) if slab is not None else None
            if slab is None or got is None:
                return None
            local, offset = got
            view = slab.view
            for i in copied:
                _, start, n = places[i]
                view[offset + start : offset + start + n] = buffers[i]
            regions.append(((slab.id << _SLAB_SHIFT) | local, offset, length))
        return ("slab", regions, places)

    def _grow(self, length: int) -> _Slab | None:
        from chute._src.exec.mp.slabs import PAGE, create_slab_fd, map_slab, send_fd

        size = -(-length * self._headroom // PAGE) * PAGE
        size = min(self._grow_to, max(size, 2 * self.slab_bytes))
        if size < length:
            return self._current  # too big for any slab we may make: it goes by pipe
        assert self._shm_dir is not None
        try:
            fd = create_slab_fd(self._shm_dir, size)
        except OSError as e:
            self._grow_to = 0  # do not try again
            mib = 1 << 20
            note = (
                f"worker could not grow its shared memory to {size / mib:.1f} MiB in "
                f"{self._shm_dir} ({e}); results larger than the current "
                f"{self.slab_bytes / mib:.1f} MiB go through pipes, which is slower. Give "
                f"{self._shm_dir} more space (Docker: `--shm-size=2g`)."
            )
            self._conn.send_bytes(pickle.dumps(("warn", -1, note), protocol=5))
            return self._current
        try:
            mapping = map_slab(fd, size)
            slab_id = self._current.id + 1 if self._current is not None else 1
            self._conn.send_bytes(pickle.dumps(("slab", -1, (slab_id, size)), protocol=5))
            send_fd(self._conn, fd)
        finally:
            os.close(fd)
        old, self._current = self._current, _Slab(slab_id, mapping)
        if old is not None:
            if old.allocator.live_regions:
                self._retired[old.id] = old
            else:
                old.close()
        return self._current

    def send_error(self, seq: int, exc: BaseException) -> None:
        with self._lock:
            self._send_error(seq, exc)

    def _send_error(self, seq: int, exc: BaseException) -> None:
        failure = RemoteFailure.capture(exc, seq)
        body = (failure.exc_bytes, failure.traceback, failure.type_name, failure.message)
        self._conn.send_bytes(pickle.dumps(("error", seq, body), protocol=5))


@dataclass(frozen=True)
class RemoteFailure:
    """An exception raised in a worker, as received by the main process.

    Picklable, so a `worker_fn` can also return one as data (`mp_prefetch` does, to
    deliver the elements computed before a failing one, then the failure).
    """

    seq: int
    exc_bytes: bytes | None
    traceback: str
    type_name: str
    message: str

    @staticmethod
    def capture(exc: BaseException, seq: int = -1) -> RemoteFailure:
        """`exc` with its traceback text, pickled if it can be."""
        tb = "".join(traceback.format_exception(exc))
        try:
            exc_bytes: bytes | None = pickle.dumps(exc, protocol=5)
        except Exception:
            exc_bytes = None
        return RemoteFailure(seq, exc_bytes, tb, type(exc).__qualname__, str(exc))

    def rebuild(self) -> BaseException:
        """The exception again (its own type, or `WorkerError` if it cannot be
        re-created here), with `__cause__` a `RemoteTraceback` of the worker's traceback."""
        from chute._src.exec.mp.errors import RemoteTraceback, WorkerError

        exc: BaseException | None = None
        if self.exc_bytes is not None:
            try:
                exc = pickle.loads(self.exc_bytes)
            except Exception:
                exc = None
        if not isinstance(exc, BaseException):
            exc = WorkerError(f"{self.type_name}: {self.message}")
        exc.__cause__ = RemoteTraceback(self.traceback)
        return exc


class ResultReceiver:
    """Main side: receives one worker's messages and rebuilds results on its slab."""

    def __init__(self, conn: Connection, slab: mmap.mmap | None) -> None:
        self._conn = conn
        self._slab = slab
        # Region ids whose arrays are all gone, to be sent back to the worker.
        self.freed: deque[int] = deque()
        # Messages from the worker about its shared memory, for the pool to warn with.
        self.warnings: deque[str] = deque()

    @property
    def slab_bytes(self) -> int:
        return len(self._slab) if self._slab is not None else 0

    def recv(self) -> tuple[int, object] | RemoteFailure:
        """Blocks for the next result: `(seq, result)` or a `RemoteFailure`.

        Raises `EOFError`/`OSError` if the worker closed the pipe.
        """
        while True:
            kind, seq, body = pickle.loads(self._conn.recv_bytes())
            if kind == "slab":  # the worker replaced its slab; its fd follows
                from chute._src.exec.mp.slabs import map_slab, recv_fd

                fd = recv_fd(self._conn)
                try:
                    # Arrays on the old slab keep its mapping alive through their base.
                    self._slab = map_slab(fd, body[1])
                finally:
                    os.close(fd)
            elif kind == "warn":
                self.warnings.append(body)
            else:
                break
        if kind == "error":
            return RemoteFailure(seq, *body)
        payload, layout, payload_at = body
        if payload_at is not None:  # the pickle lies in a region of its own
            _, offset, length = payload_at
            assert self._slab is not None, "a pickle in the slab of a worker that has none"
            payload = memoryview(self._slab)[offset : offset + length]
        try:
            if layout is None:
                return seq, pickle.loads(payload)
            if layout[0] == "slab":
                return seq, pickle.loads(payload, buffers=self._slab_buffers(layout))
            return seq, pickle.loads(payload, buffers=self._pipe_buffers(layout[1]))
        finally:
            if payload_at is not None:
                # Unpickling copied everything out of it (arrays in it were in-band).
                payload.release()
                self.freed.append(payload_at[0])

    def _slab_buffers(self, layout: tuple[Any, ...]) -> list[Any]:
        import numpy as np

        _, regions, places = layout
        # `region` is the one array every handed-out array is a view of: numpy stops
        # collapsing view chains at it because its base is the mmap, not an array.
        assert self._slab is not None, "a slab layout from a worker that has no slab"
        arrays = []
        for rid, offset, length in regions:
            region = np.frombuffer(self._slab, dtype=np.uint8, count=length, offset=offset)
            fin = weakref.finalize(region, self.freed.append, rid)
            fin.atexit = False
            arrays.append(region)
        return [arrays[r][s : s + n] for r, s, n in places]

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
