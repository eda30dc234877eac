"""`RemoteReader`: a remote object as a raw, seekable, read-only file, reading ahead
for streams."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from chute._src.core.errors import DataError

if TYPE_CHECKING:
    from concurrent.futures import Future

    from chute._src.storage.remote.fetch import Body
    from chute._src.storage.remote.file import RemoteFile

__all__ = ["RemoteReader"]


class RemoteReader(io.RawIOBase):
    """A raw, seekable, read-only file over a `RemoteFile` (for pyarrow, numpy, streams).

    With `ahead` (bytes; 0: off), reads are sequential: the first window (past the
    cached first block) is asked for when the reader is made, and once a read ends at
    `p`, the next `ahead` bytes from `p` are fetched in the background (one request on a
    daemon thread), so a stream consuming one window finds the next one there, or on the
    way.
    A read that finds its first bytes in the block cache (the first block, read when
    the object was opened) returns those at once and starts the read-ahead. At most one
    window is held or in flight per reader; a seek elsewhere drops it. Windows pass the
    block cache by: a stream reads its bytes once, and would evict the blocks that
    random reads use.

    An object whose server refuses ranges (`RemoteFile.ranges` False) is read in order
    from one plain GET instead (`RemoteFile.body`), its next chunk asked for while one is
    consumed; a seek back starts a new GET."""

    def __init__(self, f: RemoteFile, ahead: int = 0) -> None:
        super().__init__()
        self._f = f
        self._pos = 0
        self.name = f.url
        self._ahead = ahead
        self._held: tuple[int, bytes] | None = None  # (start, bytes) fetched ahead
        self._next: tuple[int, int, Future[bytes]] | None = None  # (start, end, fetch)
        self._pid = os.getpid()  # a fetch in flight belongs to this process's threads
        self._body: Body | None = None  # the plain GET of an object without ranges
        if ahead and f.ranges:  # (without ranges: a plain GET, at the first read)
            # The first window past what the block cache holds (the first block, read
            # when the object was found or opened) is asked for now: a stream opened
            # ahead of its turn (the next cycle of an interleave) finds it there.
            a = len(f.cached(0, f.size))
            z = min(a + ahead, f.size)
            if a < z:
                self._next = (a, z, f.read_later(a, z))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._f.size}[whence]
        pos = base + offset
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        end = min(self._pos + len(view), self._f.size)
        if end <= self._pos:
            return 0
        data: bytes | None = None
        if self._ahead and not self._f.ranges:
            data = self._read_body(self._pos, end)
        elif self._ahead:
            try:
                data = self._read_ahead(self._pos, end)
            except DataError:
                if self._f.ranges:
                    raise
                data = self._read_body(self._pos, end)  # the server stopped answering ranges
        if data is None:
            data = self._f.read_ranges([(self._pos, end)], cache=not self._ahead)[0]
        view[: len(data)] = data
        self._pos += len(data)
        if self._ahead and self._f.ranges and self._next is None and self._pos < self._f.size:
            a, z = self._pos, min(self._pos + self._ahead, self._f.size)
            if self._held is not None:  # the rest of the held window comes first
                a = self._held[0] + len(self._held[1])
                z = min(a + self._ahead, self._f.size)
            if a < z:
                self._pid = os.getpid()
                self._next = (a, z, self._f.read_later(a, z))
        return len(data)

    def _read_ahead(self, pos: int, end: int) -> bytes | None:
        """Bytes from `pos` (up to `end`) fetched ahead, or the cached blocks there, or
        None: read them now."""
        if self._held is not None:
            a, data = self._held
            if a <= pos < a + len(data):
                out = data[pos - a : end - a]
                if pos + len(out) >= a + len(data):
                    self._held = None
                return out
            self._held = None
        if self._next is not None and self._pid != os.getpid():
            self._next = None  # forked since: the thread fetching it is not here
        if self._next is not None:
            a, z, fut = self._next
            if a <= pos < z:
                self._next = None
                self._held = (a, fut.result())
                return self._read_ahead(pos, end)
            if pos < a:  # before the window on its way: from the cache, if it holds it
                cached = self._f.cached(pos, min(end, a))
                if cached:
                    return cached
            fut.cancel()
            self._next = None
        return self._f.cached(pos, end) or None

    def _read_body(self, pos: int, end: int) -> bytes:
        """Bytes from `pos` (up to `end`): those the block cache holds, else from the plain
        GET (started now if none is on its way to `pos`)."""
        cached = self._f.cached(pos, end)
        if cached:
            return cached
        if self._next is not None:  # a window asked for before the object lost its ranges
            self._next[2].cancel()
            self._next = None
        body = self._body
        if body is not None and (body.pos > pos or self._pid != os.getpid()):
            body.close()
            body = None
        if body is None:
            body = self._body = self._f.body(self._ahead)
            self._pid = os.getpid()
        while body.pos < pos:  # skip to `pos` (the blocks cached first, a seek ahead)
            if not self._f.read_body(body, min(pos - body.pos, self._ahead)):
                break
        return self._f.read_body(body, end - pos)

    def close(self) -> None:
        if self._next is not None:
            self._next[2].cancel()
        if self._body is not None:
            self._body.close()
        self._next, self._held, self._body = None, None, None
        super().close()

    def size(self) -> int:
        return self._f.size
