"""HTTP/1.1 range GETs on the wire: one `Call` sends a list of requests over pooled
connections and collects the answers with an `epoll` loop on the calling thread.

Each connection carries one request at a time (no pipelining): when its answer is in,
the connection takes the next queued request of its endpoint. The common answer (a head
and a small body in one `recv`) costs one `send`, one `recv`, one regular expression
over the head and one copy of the body. See `ranges.py` for what is read and why.
"""

from __future__ import annotations

import collections
import errno
import os
import re
import select
import socket
import ssl
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from chute._src.errors import DataError

if TYPE_CHECKING:
    from chute._src.remote.ranges import Endpoint, Target

__all__ = ["Call", "Conn", "HTTPStatusError", "etag_value"]

_TIMEOUT_S = 60.0  # a connection silent this long while an answer is due fails
_RECV = 1 << 18
_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")
_HEADER = re.compile(
    rb"\r\n(content-length|content-range|etag|connection|transfer-encoding)[ \t]*:[ \t]*"
    rb"([^\r]*)",
    re.IGNORECASE,
)
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_CONNECT, _HANDSHAKE, _SEND, _RECEIVE = range(4)


class HTTPStatusError(OSError):
    """An answer other than the range asked for; `status` is the HTTP status."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def etag_value(tag: str | None) -> str:
    """An ETag without quotes or the weak marker: `'"ab"'` -> `'ab'`."""
    tag = (tag or "").strip()
    return tag[2:].strip('"') if tag.startswith("W/") else tag.strip('"')


class Conn:
    """One connection: its socket, and the answer being read on it."""

    __slots__ = (
        "body",
        "buf",
        "fd",
        "head",
        "k",
        "last",
        "length",
        "mask",
        "out",
        "reused",
        "sock",
        "stage",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.stage = _CONNECT
        self.mask = 0  # the epoll events it is registered for in the current call
        self.reused = False
        self.last = time.monotonic()
        self.k = -1
        self.buf: bytes | bytearray = b""
        self.out = b""
        self.head: tuple[int, dict[bytes, bytes]] | None = None
        self.body = -1  # where the body starts in buf, once the head is read
        self.length = -1  # body bytes; -1: until the connection closes; -2: chunked

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Call:
    """The state of one `ranges.fetch`: queued requests per endpoint, connections,
    answers (`out`: bytes or the exception, per request)."""

    def __init__(self, requests: Sequence[tuple[Target, int, int]]) -> None:
        self.requests = requests
        self.out: list[Any] = [None] * len(requests)
        self.poll = select.epoll()
        self.queues: dict[Endpoint, collections.deque[int]] = {}
        self.spare: dict[Endpoint, int] = {}  # connections this call may still open
        self.owner: dict[Conn, Endpoint] = {}
        self.by_fd: dict[int, Conn] = {}
        self.done: dict[Endpoint, list[Conn]] = {}  # healthy, back to the pool at the end
        self.opened: dict[Endpoint, int] = {}  # counted by take(), not yet given back
        self.renewed: set[int] = set()
        # Endpoints that refused a connection in this call: no more are opened to them;
        # their queued requests wait for the connections still open (or fail with this).
        self.refused: dict[Endpoint, BaseException] = {}
        self.sent_at: dict[int, float] = {}
        for k, (t, _, _) in enumerate(requests):
            self.queues.setdefault(t.endpoint, collections.deque()).append(k)

    def run(self) -> None:
        for ep in list(self.queues):
            self._enlist(ep)
        last_sweep = time.monotonic()
        by_fd = self.by_fd
        while self.owner:
            events = self.poll.poll(1.0)
            for fd, _ in events:
                c = by_fd.get(fd)
                if c is not None:
                    self._step(c)
                else:  # a parked connection the server closed: checked when next taken
                    self.poll.unregister(fd)
            now = time.monotonic()
            if not events or now - last_sweep > 1.0:
                last_sweep = now
                for c in [c for c in self.owner if now - c.last > _TIMEOUT_S]:
                    self._lost(c, TimeoutError(f"no answer in {_TIMEOUT_S:.0f} s"))

    def finish(self) -> None:
        for queue in self.queues.values():
            queue.clear()
        for c in list(self.owner):  # only after an exception escaped run()
            self._drop(c)
        for ep, conns in self.done.items():
            for c in conns:
                c.mask = 0
            ep.give(conns, self.opened[ep] - len(conns))
        self.poll.close()

    # -- connections -----------------------------------------------------------------
    def _enlist(self, ep: Endpoint) -> None:
        """Takes connections from `ep`'s pool (and leave to open more) for its queue."""
        queue = self.queues.setdefault(ep, collections.deque())
        if ep not in self.spare:
            conns, more = ep.take(len(queue) or 1)
            self.opened[ep], self.spare[ep], self.done[ep] = len(conns) + more, more, []
            for c in conns:
                self.owner[c] = ep
                self.by_fd[c.fd] = c
                self._next(c)
        while self.spare[ep] and queue and ep not in self.refused and self._open(ep):
            pass

    def _open(self, ep: Endpoint) -> bool:
        self.spare[ep] -= 1
        try:
            c = ep.connect()
        except OSError as e:
            self.spare[ep] += 1
            self.refused[ep] = e
            self._fail_unserved(ep)
            return False
        self.owner[c] = ep
        self.by_fd[c.fd] = c
        self._watch(c, _OUT)
        return True

    def _watch(self, c: Conn, mask: int) -> None:
        if c.mask == mask:
            return
        if c.mask:
            self.poll.modify(c.fd, mask)
        else:
            self.poll.register(c.fd, mask)
        c.mask = mask

    def _drop(self, c: Conn) -> None:
        """Closes `c`; opens a replacement when requests wait."""
        ep = self.owner.pop(c)
        self.by_fd.pop(c.fd, None)
        if c.mask:
            try:
                self.poll.unregister(c.fd)
            except OSError:
                pass
        c.close()
        self.spare[ep] += 1
        if self.queues[ep]:
            if ep in self.refused:
                self._fail_unserved(ep)
            else:
                self._open(ep)

    def _fail_unserved(self, ep: Endpoint) -> None:
        """After `ep` refused a connection: its queued requests fail with that error
        when no connection of `ep` is left open in this call to take them."""
        if any(o is ep for o in self.owner.values()):
            return
        queue, e = self.queues[ep], self.refused[ep]
        while queue:
            self.out[queue.popleft()] = e

    def _fail(self, c: Conn, e: BaseException) -> None:
        if c.k >= 0:
            self.out[c.k] = e
            c.k = -1
        self._drop(c)

    def _lost(self, c: Conn, e: BaseException) -> None:
        """The connection broke before an answer: a reused one (the server closed it
        while idle) is replaced and the request sent again; else the request failed. One
        that could not be opened (refused, TLS failed) stops this call from opening more
        to its endpoint: the connections of it still open take the queued requests, and
        when none is left they fail with this error (the caller retries them)."""
        if c.stage in (_CONNECT, _HANDSHAKE):
            self.refused.setdefault(self.owner[c], e)
        elif c.reused and not c.buf and c.k >= 0:
            self.queues[self.owner[c]].appendleft(c.k)
            c.k = -1
        self._fail(c, e)

    def _next(self, c: Conn) -> None:
        """Gives `c` the next queued request of its endpoint, or parks it."""
        ep = self.owner[c]
        queue = self.queues[ep]
        if not queue:  # parked; left registered until the poll closes (a syscall less)
            del self.owner[c]
            del self.by_fd[c.fd]
            self.done[ep].append(c)
            return
        k = queue.popleft()
        t, a, b = self.requests[k]
        self.sent_at[k] = t.signed_at
        c.k, c.buf, c.head, c.body, c.length = k, b"", None, -1, -1
        c.out = t.request(a, b)
        c.stage = _RECEIVE
        try:
            n = c.sock.send(c.out)
            c.out = c.out[n:]
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            pass
        except OSError as e:
            self._lost(c, e)
            return
        if c.out:
            c.stage = _SEND
        self._watch(c, _OUT if c.out else _IN)

    # -- events ----------------------------------------------------------------------
    def _step(self, c: Conn) -> None:
        c.last = time.monotonic()
        try:
            if c.stage == _RECEIVE:
                self._receive(c)
            elif c.stage == _SEND:
                n = c.sock.send(c.out)
                c.out = c.out[n:]
                if not c.out:
                    c.stage = _RECEIVE
                    self._watch(c, _IN)
            elif c.stage == _CONNECT:
                err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise ConnectionRefusedError(err, os.strerror(err))
                ep = self.owner[c]
                if ep.context is None:
                    self._next(c)
                    return
                c.sock = ep.context.wrap_socket(
                    c.sock, server_hostname=ep.host, do_handshake_on_connect=False
                )
                c.stage = _HANDSHAKE
                self._handshake(c)
            else:
                self._handshake(c)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            pass
        except (OSError, ValueError) as e:  # ssl.SSLError included; ValueError: bad numbers
            if c in self.owner:
                if not isinstance(e, OSError):
                    e = ConnectionError(f"not an HTTP/1.1 answer ({e})")
                self._lost(c, e)

    def _handshake(self, c: Conn) -> None:
        assert isinstance(c.sock, ssl.SSLSocket)
        try:
            c.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._watch(c, _IN)
            return
        except ssl.SSLWantWriteError:
            self._watch(c, _OUT)
            return
        except ssl.SSLCertVerificationError as e:
            ep = self.owner[c]
            self._lost(c, PermissionError(f"TLS certificate of {ep.netloc} refused: {e}"))
            return
        self._next(c)

    def _receive(self, c: Conn) -> None:
        data = c.sock.recv(_RECV)
        if isinstance(c.sock, ssl.SSLSocket):
            while c.sock.pending():
                data += c.sock.recv(_RECV)
        if not data:
            if c.head is not None and c.length == -1:  # the body ends with the connection
                self._answer(c, bytes(c.buf[c.body :]), keep=False)
            else:
                self._lost(c, ConnectionResetError("the server closed the connection"))
            return
        if not c.buf:
            buf: bytes | bytearray = data  # the common case: a whole answer in one piece
            c.buf = data
        else:  # pieces: gathered in a bytearray (no quadratic copying)
            if isinstance(c.buf, bytes):
                c.buf = bytearray(c.buf)
            c.buf += data
            buf = c.buf
        if c.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    raise ConnectionError("an HTTP answer's head is over 64 KiB")
                return
            c.head = _parse_head(bytes(buf[:end]))
            c.body = end + 4
            headers = c.head[1]
            length = headers.get(b"content-length")
            if length is not None:
                c.length = int(length)
            elif b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                c.length = -2
        if c.length >= 0:
            end = c.body + c.length
            if len(buf) < end:
                return
            body = bytes(buf[c.body : end])
        elif c.length == -2:
            got = _dechunk(buf, c.body)
            if got is None:
                return
            body, end = got
        else:
            return
        keep = len(buf) == end and c.head[1].get(b"connection", b"").lower() != b"close"
        self._answer(c, body, keep)

    def _answer(self, c: Conn, body: bytes, keep: bool) -> None:
        assert c.head is not None
        status, headers = c.head
        k, c.k = c.k, -1
        t, a, b = self.requests[k]
        c.buf = b""
        if status == 403 and k not in self.renewed and t.renewable:
            self.renewed.add(k)  # the presigned URL expired or was refused: sign again
            try:
                t.renew(if_signed_before=self.sent_at[k])
            except Exception as e:  # the store's client cannot sign: that is the answer
                self.out[k] = e
            else:
                self.queues.setdefault(t.endpoint, collections.deque()).appendleft(k)
                if t.endpoint is not self.owner[c]:
                    self._enlist(t.endpoint)
        else:
            self.out[k] = check(t, a, b, status, headers, body)
        if keep:
            c.reused = True
            self._next(c)
        else:
            self._drop(c)


def _parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """(status, {lower-case name: value}) of the headers `check` reads."""
    if not head.startswith(b"HTTP/1.") or not head[9:12].isdigit():
        raise ConnectionError(f"not an HTTP/1.x answer: {head[:80]!r}")
    headers = {name.lower(): value for name, value in _HEADER.findall(head)}
    if head[7:8] == b"0" and headers.get(b"connection", b"").lower() != b"keep-alive":
        headers[b"connection"] = b"close"
    return int(head[9:12]), headers


def _dechunk(buf: bytes | bytearray, at: int) -> tuple[bytes, int] | None:
    """A chunked body that starts at `at` in `buf` and where it ends, or None if partial."""
    parts: list[bytes] = []
    while True:
        eol = buf.find(b"\r\n", at)
        if eol < 0:
            return None
        size = int(buf[at:eol].split(b";")[0], 16)
        at = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", at - 2)
            return (b"".join(parts), end + 4) if end >= 0 else None
        if len(buf) < at + size + 2:
            return None
        parts.append(bytes(buf[at : at + size]))
        at += size + 2


def check(
    t: Target, a: int, b: int, status: int, headers: dict[bytes, bytes], body: bytes
) -> bytes | BaseException:
    """The bytes of a good answer to a GET of `[a, b)`, or the error it means. The first
    answer for a target of unknown size (-1) tells its size and ETag (`_first_answer`)."""
    if t.size < 0 and status in (200, 206):
        return _first_answer(t, a, b, status, headers, body)
    if status == 206 or status == 200:
        tag = etag_value(headers.get(b"etag", b"").decode("latin-1"))
        if t.etag and tag and tag != t.etag:
            return DataError(
                f"{t.url}: the object changed after chute opened it (ETag then "
                f"{t.etag!r}, now {tag!r}); a dataset must not be rewritten in place while "
                "it is read: write new objects under new names, then reopen the source"
            )
        if status == 200:  # the whole object: the server ignored the range
            if len(body) != t.size:
                return DataError(
                    f"{t.url}: the object has {len(body)} bytes, not the {t.size} it had "
                    "when chute opened it; reopen the source"
                )
            return body[a:b]
        want = b"bytes %d-%d/%d" % (a, b - 1, t.size)
        got = headers.get(b"content-range", b"")
        if got != want or len(body) != b - a:
            return DataError(
                f"{t.url}: a read of bytes [{a}, {b}) came back as "
                f"{got.decode('latin-1') or 'no range'!r} with {len(body)} bytes, not "
                f"{want.decode()!r}: the object changed since chute opened it, or the "
                "store is failing; reopen the source"
            )
        return body
    code = _CODE.search(body[:4096])
    text = f"HTTP {status}" + (f" {code.group(1).decode('latin-1')}" if code else "")
    if status == 404:
        return FileNotFoundError(errno.ENOENT, text, t.url)
    if status == 403:
        return PermissionError(errno.EACCES, text, t.url)
    return HTTPStatusError(status, text)


_TOTAL = re.compile(rb"bytes (\d+)-(\d+)/(\d+)")


def _first_answer(
    t: Target, a: int, b: int, status: int, headers: dict[bytes, bytes], body: bytes
) -> bytes | BaseException:
    """The bytes of the first answer for `t` (size not known yet), which sets `t.size`
    (the `Content-Range` total, or the whole body of a 200) and `t.etag`."""
    tag = etag_value(headers.get(b"etag", b"").decode("latin-1"))
    if status == 200:  # the whole object: the server ignored the range
        t.size, t.etag = len(body), tag
        return body[a:b]
    got = headers.get(b"content-range", b"")
    m = _TOTAL.fullmatch(got.strip())
    if m is not None:
        first, last, total = (int(x) for x in m.groups())
        if first == a and last == min(b, total) - 1 and len(body) == last - first + 1:
            t.size, t.etag = total, tag
            return body
    return DataError(
        f"{t.url}: a read of bytes [{a}, {b}) came back as "
        f"{got.decode('latin-1') or 'no range'!r} with {len(body)} bytes, not that range "
        "of the object: the store is failing; reopen the source"
    )
