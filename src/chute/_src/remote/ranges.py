"""Byte-range GETs over pooled keep-alive HTTP/1.1 connections, with little CPU each.

fsspec's S3 client (s3fs over aiobotocore) spends milliseconds of CPU on every request
(building it, signing it with SigV4, parsing the answer through botocore's layers); a
random read of a small record is one request, so that cost is the rate. For objects it
applies to (`target`), chute reads ranges itself instead:

- `s3://`: the object is located once by a presigned GET URL, made by the s3fs file
  system the user's storage options built (its credentials, endpoint and region), renewed
  before it expires and on a 403 answer; `http(s)://`: the URL itself.
- `fetch` sends `Range:` GETs on connections taken from the endpoint's pool (opened
  without blocking, TLS included), many in flight, and waits for the answers with one
  `selectors` loop on the calling thread: no thread, no event loop, one `send` and
  usually one `recv` per request. Several threads may fetch at once, each with its own
  connections.
- An answer must be `206` with the `Content-Range` asked for, the object's size and its
  ETag from when it was opened: otherwise a `DataError` names the URL (the object was
  replaced). A connection the server closes after each answer (or before a reused one is
  written to) is replaced; 5xx and 429 answers, resets and timeouts are transient errors
  for `calls.py`'s bounded retries; 404 is a missing object, a 403 on a fresh URL is a
  refusal.

Connections stay open while a `Target` of their endpoint lives (an open remote file), up
to `_IDLE_S` idle, and are closed when the last one goes. `CHUTE_REMOTE_HTTP=fsspec`
reads through fsspec instead.
"""

from __future__ import annotations

import collections
import errno
import os
import re
import selectors
import socket
import ssl
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from chute._src.errors import DataError

__all__ = ["Target", "fetch", "target"]

_MAX_CONNS = 256  # open connections per endpoint (a call may go over by one)
_IDLE_S = 20.0  # an idle connection older than this is closed, not reused
_TIMEOUT_S = 60.0  # a connection silent this long while an answer is due fails
_PRESIGN_S = 3600  # lifetime asked for a presigned URL (CHUTE_REMOTE_PRESIGN_S)
_RECV = 1 << 18
_CODE = re.compile(rb"<Code>([^<]{1,64})</Code>")


class HTTPStatusError(OSError):
    """An answer other than the range asked for; `status` is the HTTP status."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


class _Conn:
    __slots__ = ("body", "buf", "head", "k", "last", "length", "out", "reused", "sock", "stage")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stage = _CONNECT
        self.reused = False
        self.last = time.monotonic()
        self.k = -1
        self.buf = bytearray()
        self.out = b""
        self.head: tuple[int, dict[str, str]] | None = None
        self.body = -1  # where the body starts in buf, once the head is read
        self.length = -1  # body bytes; -1: until the connection closes; -2: chunked

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


_CONNECT, _HANDSHAKE, _SEND, _RECV_HEAD, _IDLE = range(5)


class Endpoint:
    """The pool of connections to one `scheme://host:port`; closed when unreferenced."""

    def __init__(self, scheme: str, host: str, port: int, context: ssl.SSLContext | None):
        self.host, self.port, self.context = host, port, context
        self.netloc = host if port == (443 if scheme == "https" else 80) else f"{host}:{port}"
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.opened = 0
        self.idle: list[_Conn] = []
        weakref.finalize(self, _close_all, self.idle)

    def take(self, n: int) -> tuple[list[_Conn], int]:
        """Up to `n` idle connections, and how many more may be opened (at least one
        when none is idle)."""
        now = time.monotonic()
        with self.lock:
            if self.pid != os.getpid():  # forked: the parent's connections are not ours
                self.pid, self.opened = os.getpid(), 0
                _close_all(self.idle)
            out: list[_Conn] = []
            while self.idle and len(out) < n:
                c = self.idle.pop()
                if now - c.last > _IDLE_S:
                    c.close()
                    self.opened -= 1
                else:
                    out.append(c)
            more = max(0, min(n - len(out), _MAX_CONNS - self.opened))
            if not out and not more:
                more = 1
            self.opened += more
            return out, more

    def give(self, conns: list[_Conn], opened_not_returned: int) -> None:
        with self.lock:
            if self.pid != os.getpid():
                _close_all(conns)
                return
            self.opened -= opened_not_returned
            for c in conns:
                c.stage, c.reused, c.last = _IDLE, True, time.monotonic()
            self.idle.extend(conns)

    def connect(self) -> _Conn:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            err = sock.connect_ex((self.host, self.port))
            if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                raise ConnectionRefusedError(err, f"{os.strerror(err)}: {self.netloc}")
        except BaseException:
            sock.close()
            raise
        return _Conn(sock)


def _close_all(conns: list[_Conn]) -> None:
    for c in conns:
        c.close()
    conns.clear()


_endpoints: weakref.WeakValueDictionary[tuple[Any, ...], Endpoint] = weakref.WeakValueDictionary()
_endpoints_lock = threading.Lock()


def _endpoint(url: str, verify: Any) -> tuple[Endpoint, str]:
    """The pool for `url`'s host, and the request target (path and query)."""
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    host = u.hostname or ""
    if scheme not in ("http", "https") or not host:
        raise ValueError(f"{url!r}: not an http(s) URL")
    port = u.port or (443 if scheme == "https" else 80)
    key = (scheme, host, port, repr(verify))
    with _endpoints_lock:
        ep = _endpoints.get(key)
        if ep is None:
            context = None
            if scheme == "https":
                cafile = verify if isinstance(verify, str) else None
                context = ssl.create_default_context(cafile=cafile)
                if verify is False:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
            ep = Endpoint(scheme, host, port, context)
            _endpoints[key] = ep
    path = u.path or "/"
    return ep, path + (f"?{u.query}" if u.query else "")


class Target:
    """One object as `fetch` reads it: where to GET it (`locate()`, renewed after
    `expires_s` when it is presigned) and what it was when opened (size, ETag)."""

    def __init__(
        self,
        url: str,
        size: int,
        etag: str,
        locate: Callable[[], str],
        expires_s: float | None,
        verify: Any = True,
    ) -> None:
        self.url, self.size, self.etag = url, size, _etag(etag)
        self._locate, self._expires_s, self._verify = locate, expires_s, verify
        self._lock = threading.Lock()
        self.renew()

    def renew(self, if_signed_before: float | None = None) -> None:
        """Locates the object again (a fresh presigned URL), unless that was done since
        `if_signed_before`."""
        with self._lock:
            if if_signed_before is not None and self.signed_at > if_signed_before:
                return
            located = self._locate()
            self.endpoint, target = _endpoint(located, self._verify)
            self.signed_at = time.monotonic()
            self.renew_at = (
                self.signed_at + 0.75 * self._expires_s if self._expires_s else float("inf")
            )
            self.prefix = (
                f"GET {target} HTTP/1.1\r\nHost: {self.endpoint.netloc}\r\n"
                "User-Agent: chute\r\nAccept-Encoding: identity\r\nRange: bytes="
            ).encode("latin-1")

    def request(self, a: int, b: int) -> bytes:
        if time.monotonic() > self.renew_at:
            self.renew(if_signed_before=self.renew_at - 0.75 * (self._expires_s or 0))
        return self.prefix + b"%d-%d\r\n\r\n" % (a, b - 1)


def _etag(tag: str | None) -> str:
    tag = (tag or "").strip()
    return tag[2:].strip('"') if tag.startswith("W/") else tag.strip('"')


def presign_seconds() -> int:
    """`CHUTE_REMOTE_PRESIGN_S` (default 3600): how long a presigned URL is asked to last."""
    raw = os.environ.get("CHUTE_REMOTE_PRESIGN_S", str(_PRESIGN_S))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(
            f"CHUTE_REMOTE_PRESIGN_S={raw!r} is not a positive integer; set it to the "
            "seconds a presigned URL lasts (default 3600)"
        )
    return n


def target(url: str, fs: Any, path: str, size: int, identity: str) -> Target | None:
    """A `Target` for the object `path` of `fs` when chute can read it with `fetch`
    (s3fs without request options that a presigned GET cannot carry; fsspec's http),
    else None: fsspec reads it."""
    if os.environ.get("CHUTE_REMOTE_HTTP", "").lower() == "fsspec":
        return None
    etag = identity[5:] if identity.startswith("ETag=") else ""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("s3", "s3a"):
        if getattr(fs, "s3_additional_kwargs", None) or getattr(fs, "req_kw", None):
            return None  # server-side encryption keys, requester pays: signed headers
        expires = presign_seconds()
        verify = (getattr(fs, "client_kwargs", None) or {}).get("verify", True)
        return Target(url, size, etag, lambda: fs.url(path, expires=expires), expires, verify)
    if protocol in ("http", "https"):
        return Target(url, size, etag, lambda: path, None)
    return None


def fetch(requests: Sequence[tuple[Target, int, int]]) -> list[Any]:
    """One try at each `(target, start, end)`: its bytes, or the exception that failed it
    (transient ones for the caller to retry)."""
    call = _Call(requests)
    try:
        call.run()
    finally:
        call.finish()
    return call.out


class _Call:
    """The state of one `fetch`: queued requests per endpoint, connections, answers."""

    def __init__(self, requests: Sequence[tuple[Target, int, int]]) -> None:
        self.requests = requests
        self.out: list[Any] = [None] * len(requests)
        self.sel = selectors.DefaultSelector()
        self.queues: dict[Endpoint, collections.deque[int]] = {}
        self.spare: dict[Endpoint, int] = {}  # connections this call may still open
        self.owner: dict[_Conn, Endpoint] = {}
        self.done: dict[Endpoint, list[_Conn]] = {}  # healthy, back to the pool at the end
        self.opened: dict[Endpoint, int] = {}  # counted by take(), not yet given back
        self.renewed: set[int] = set()
        self.sent_at: dict[int, float] = {}
        for k, (t, _, _) in enumerate(requests):
            self.queues.setdefault(t.endpoint, collections.deque()).append(k)

    def run(self) -> None:
        for ep, queue in self.queues.items():
            conns, more = ep.take(len(queue))
            self.opened[ep] = len(conns) + more
            self.spare[ep] = more
            self.done[ep] = []
            for c in conns:
                self.owner[c] = ep
                self._next(c)
            while self.spare[ep] and queue and self._open(ep):
                pass
        last_sweep = time.monotonic()
        while self.owner:
            events = self.sel.select(1.0)
            for key, mask in events:
                self._step(key.data, mask)
            now = time.monotonic()
            if not events or now - last_sweep > 1.0:
                last_sweep = now
                for c in [c for c in self.owner if now - c.last > _TIMEOUT_S]:
                    self._fail(c, TimeoutError(f"no answer in {_TIMEOUT_S:.0f} s"))

    def finish(self) -> None:
        for queue in self.queues.values():
            queue.clear()
        for c in list(self.owner):  # only after an exception escaped run()
            self._drop(c)
        for ep, conns in self.done.items():
            ep.give(conns, self.opened[ep] - len(conns))
        self.sel.close()

    # -- connections -----------------------------------------------------------------
    def _open(self, ep: Endpoint) -> bool:
        self.spare[ep] -= 1
        try:
            c = ep.connect()
        except OSError as e:
            self.spare[ep] += 1
            queue = self.queues[ep]
            if not any(self.owner[o] is ep for o in self.owner):
                while queue:  # nothing else will take them
                    self.out[queue.popleft()] = e
            return False
        self.owner[c] = ep
        self.sel.register(c.sock, selectors.EVENT_WRITE, c)
        return True

    def _drop(self, c: _Conn) -> None:
        """Closes `c`; opens a replacement when requests wait."""
        ep = self.owner.pop(c)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.close()
        self.spare[ep] += 1
        if self.queues[ep]:
            self._open(ep)

    def _fail(self, c: _Conn, e: BaseException) -> None:
        if c.k >= 0:
            self.out[c.k] = e
            c.k = -1
        self._drop(c)

    def _next(self, c: _Conn) -> None:
        """Gives `c` the next queued request of its endpoint, or parks it."""
        ep = self.owner[c]
        queue = self.queues[ep]
        if not queue:
            self.owner.pop(c)
            if c.stage != _IDLE:
                self.sel.unregister(c.sock)
            c.stage = _IDLE
            self.done[ep].append(c)
            return
        k = queue.popleft()
        t, a, b = self.requests[k]
        c.k, c.buf, c.head, c.body, c.length = k, bytearray(), None, -1, -1
        self.sent_at[k] = t.signed_at
        c.out = t.request(a, b)
        c.last = time.monotonic()
        events = selectors.EVENT_READ
        try:
            n = c.sock.send(c.out)
            c.out = c.out[n:]
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            pass
        except OSError as e:
            self._lost(c, e)
            return
        if c.out:
            events = selectors.EVENT_WRITE
            c.stage = _SEND
        else:
            c.stage = _RECV_HEAD
        if self._registered(c):
            self.sel.modify(c.sock, events, c)
        else:
            self.sel.register(c.sock, events, c)

    def _registered(self, c: _Conn) -> bool:
        try:
            self.sel.get_key(c.sock)
            return True
        except KeyError:
            return False

    def _lost(self, c: _Conn, e: BaseException) -> None:
        """The connection broke before an answer: a reused one (the server closed it
        while idle) is replaced and the request sent again; else the request failed."""
        if c.reused and not c.buf and c.k >= 0:
            self.queues[self.owner[c]].appendleft(c.k)
            c.k = -1
        self._fail(c, e)

    # -- events ----------------------------------------------------------------------
    def _step(self, c: _Conn, mask: int) -> None:
        if c not in self.owner:
            return
        c.last = time.monotonic()
        try:
            if c.stage == _CONNECT:
                err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise ConnectionRefusedError(err, os.strerror(err))
                ep = self.owner[c]
                if ep.context is None:
                    self._next(c)
                    return
                self.sel.unregister(c.sock)
                c.sock = ep.context.wrap_socket(
                    c.sock, server_hostname=ep.host, do_handshake_on_connect=False
                )
                c.stage = _HANDSHAKE
                self.sel.register(c.sock, selectors.EVENT_WRITE, c)
                self._handshake(c)
            elif c.stage == _HANDSHAKE:
                self._handshake(c)
            elif c.stage == _SEND:
                n = c.sock.send(c.out)
                c.out = c.out[n:]
                if not c.out:
                    c.stage = _RECV_HEAD
                    self.sel.modify(c.sock, selectors.EVENT_READ, c)
            else:
                self._receive(c)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            pass
        except OSError as e:  # ssl.SSLError included
            if c in self.owner:
                self._lost(c, e)

    def _handshake(self, c: _Conn) -> None:
        assert isinstance(c.sock, ssl.SSLSocket)
        try:
            c.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.sel.modify(c.sock, selectors.EVENT_READ, c)
            return
        except ssl.SSLWantWriteError:
            self.sel.modify(c.sock, selectors.EVENT_WRITE, c)
            return
        except ssl.SSLCertVerificationError as e:
            ep = self.owner[c]
            self._fail(c, PermissionError(f"TLS certificate of {ep.netloc} refused: {e}"))
            return
        self._next(c)

    def _receive(self, c: _Conn) -> None:
        data = c.sock.recv(_RECV)
        if isinstance(c.sock, ssl.SSLSocket):
            while c.sock.pending():
                data += c.sock.recv(_RECV)
        if not data:
            if c.head is not None and c.length == -1:  # the body ends with the connection
                self._answer(c, bytes(c.buf[c.body :]), keep=False)
                return
            self._lost(c, ConnectionResetError("the server closed the connection"))
            return
        c.buf += data
        if c.head is None:
            end = c.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(c.buf) > 65536:
                    raise ConnectionError("an HTTP answer's head is over 64 KiB")
                return
            c.head = _parse_head(c.buf[:end])
            c.body = end + 4
            headers = c.head[1]
            if "content-length" in headers:
                c.length = int(headers["content-length"])
            elif "chunked" in headers.get("transfer-encoding", "").lower():
                c.length = -2
        if c.length >= 0:
            if len(c.buf) - c.body < c.length:
                return
            body = bytes(c.buf[c.body : c.body + c.length])
            extra = len(c.buf) - c.body - c.length
        elif c.length == -2:
            got = _dechunk(c.buf, c.body)
            if got is None:
                return
            body, used = got
            extra = len(c.buf) - used
        else:
            return
        headers = c.head[1]
        keep = extra == 0 and headers.get("connection", "").lower() != "close"
        self._answer(c, body, keep)

    def _answer(self, c: _Conn, body: bytes, keep: bool) -> None:
        assert c.head is not None
        status, headers = c.head
        k = c.k
        c.k = -1
        t, a, b = self.requests[k]
        if status == 403 and k not in self.renewed and t.renew_at != float("inf"):
            self.renewed.add(k)  # the presigned URL expired or was refused: sign again
            t.renew(if_signed_before=self.sent_at[k])
            self.queues[t.endpoint].appendleft(k)
            if t.endpoint is not self.owner[c]:
                self._spare_for(t.endpoint)
        else:
            self.out[k] = _check(t, a, b, status, headers, body)
        if keep:
            c.reused = True
            self._next(c)
        else:
            self._drop(c)

    def _spare_for(self, ep: Endpoint) -> None:
        """A request moved to another endpoint (a renewed URL elsewhere): open for it."""
        if ep not in self.spare:
            conns, more = ep.take(1)
            self.queues.setdefault(ep, collections.deque())
            self.opened[ep], self.spare[ep], self.done[ep] = len(conns) + more, more, []
            for c in conns:
                self.owner[c] = ep
                self._next(c)
        if self.queues[ep] and self.spare[ep]:
            self._open(ep)


def _parse_head(head: bytearray) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if parts[0] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    return int(parts[1]), headers


def _dechunk(buf: bytearray, at: int) -> tuple[bytes, int] | None:
    """A chunked body that starts at `at` in `buf` and where it ends, or None if partial."""
    parts: list[bytes] = []
    while True:
        eol = buf.find(b"\r\n", at)
        if eol < 0:
            return None
        size = int(bytes(buf[at:eol]).split(b";")[0], 16)
        at = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", at - 2)
            return (b"".join(parts), end + 4) if end >= 0 else None
        if len(buf) < at + size + 2:
            return None
        parts.append(bytes(buf[at : at + size]))
        at += size + 2


def _check(
    t: Target, a: int, b: int, status: int, headers: dict[str, str], body: bytes
) -> bytes | BaseException:
    """The bytes of a good answer, or the error it means."""
    if status == 206 or status == 200:
        tag = _etag(headers.get("etag"))
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
        want = f"bytes {a}-{b - 1}/{t.size}"
        got = headers.get("content-range", "")
        if got != want or len(body) != b - a:
            return DataError(
                f"{t.url}: a read of bytes [{a}, {b}) came back as {got or 'no range'!r} "
                f"with {len(body)} bytes, not {want!r}: the object changed since chute "
                "opened it or the store is failing; reopen the source"
            )
        return body
    code = _CODE.search(body[:4096])
    text = f"HTTP {status}" + (f" {code.group(1).decode('latin-1')}" if code else "")
    if status == 404:
        return FileNotFoundError(errno.ENOENT, text, t.url)
    if status == 403:
        return PermissionError(errno.EACCES, text, t.url)
    return HTTPStatusError(status, text)
