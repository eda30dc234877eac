"""A small, deliberately misbehaving HTTP/1.1 server for tests of remote reads.

Threads on 127.0.0.1 (or ::1): one accepting, one per connection. Each request is read
(request line and headers), recorded, and answered by `HostileServer.mode`: "normal"
(a correct `206` with `Content-Range`, `Content-Length`, `ETag` when `etag` is set and
`Last-Modified` when `modified` is set) or one of the misbehaviours the tests name, among
them servers without ranges: "no-ranges" answers every GET with `200` and the whole
object, as Python's `http.server` and many static hosts do; "ranges-ignored" does the
same while it says `Accept-Ranges: bytes`; "wrong-content-range" answers a range with a
`206` of another range (one byte further), labelled as such.
Every loop is bounded: a connection waits at most 0.2 s per poll for the server's stop
flag, a trickle or a flood stops at `max_bytes` or when the server stops, so nothing
outlives the `with` block (threads are joined on exit).
"""

from __future__ import annotations

import base64
import email.utils
import socket
import threading
import time
from dataclasses import dataclass, field

_CHUNK = b"\0" * (64 << 10)


@dataclass
class Request:
    method: str
    target: str  # as sent: percent-encoded path
    headers: dict[str, str]  # names lower-cased


@dataclass
class HostileServer:
    files: dict[str, bytes]  # request target (as sent) -> content
    host: str = "127.0.0.1"
    mode: str = "normal"
    etag: str | None = '"v1"'
    modified: float | None = 1_700_000_000.0  # seconds since the epoch
    require_auth: str | None = None  # the exact Authorization header to demand
    max_bytes: int = 3 << 30  # the most a flood or a trickle sends
    normal_answers: int = 1  # in a "-later" mode, the GETs answered well first
    requests: list[Request] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._answered = 0

    def __enter__(self) -> HostileServer:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in list(self._threads):
            t.join(timeout=10)
        self._sock.close()

    def url(self, target: str, userinfo: str = "") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{userinfo}{host}:{self.port}{target}"

    def replace(self, target: str, data: bytes, *, etag: str | None, later_s: float) -> None:
        """The object at `target` replaced in place: new bytes, ETag and Last-Modified."""
        self.files[target] = data
        self.etag = etag
        self.modified = (self.modified or 0) + later_s

    def _spawn(self, fn: object, *args: object) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(0.2)
            self._spawn(self._serve, conn)

    def _read_head(self, conn: socket.socket, buf: bytearray) -> bytes | None:
        while b"\r\n\r\n" not in buf:
            if self._stop.is_set() or len(buf) > 1 << 16:
                return None
            try:
                got = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return None
            if not got:
                return None
            buf += got
        end = buf.index(b"\r\n\r\n")
        head = bytes(buf[:end])
        del buf[: end + 4]
        return head

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        with conn:
            while not self._stop.is_set():
                head = self._read_head(conn, buf)
                if head is None:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                req = Request(method, target, headers)
                with self._lock:
                    self.requests.append(req)
                try:
                    if not self._answer(conn, req):
                        return
                except OSError:
                    return

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)

    def _answer(self, conn: socket.socket, req: Request) -> bool:
        """Answers `req`; False: close the connection."""
        if req.target.startswith("http://"):  # a proxy's request: forwarded, logged
            return self._forward(conn, req)
        if self.require_auth is not None and req.headers.get("authorization") != self.require_auth:
            body = b"who are you?"
            self._send(
                conn,
                b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=t\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
            )
            return True
        data = self.files.get(req.target)
        if data is None:
            self._send(conn, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return True
        size = len(data)
        a, b = 0, size - 1
        rng = req.headers.get("range", "")
        if rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            a, b = int(first), min(int(last), size - 1) if last else size - 1
        if a >= size and size:
            self._send(conn, b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Length: 0\r\n\r\n")
            return True
        body = data[a : b + 1]
        meta = b""
        if self.etag is not None:
            meta += b"ETag: %s\r\n" % self.etag.encode()
        if self.modified is not None:
            meta += (
                b"Last-Modified: %s\r\n"
                % email.utils.formatdate(self.modified, usegmt=True).encode()
            )
        crange = b"Content-Range: bytes %d-%d/%d\r\n" % (a, b, size)
        status = b"206 Partial Content" if rng else b"200 OK"
        if not rng:
            crange = b""
        if req.method == "HEAD":
            self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (size, meta))
            return True
        with self._lock:
            self._answered += 1
            nth = self._answered
        mode = self.mode
        if mode == "etag-first-only":
            mode = "normal"
        if self.mode == "etag-first-only" and nth > 1:
            meta = b"".join(
                h + b"\r\n" for h in meta.split(b"\r\n") if h and not h.startswith(b"ETag")
            )
            mode = "normal"
        if mode == "normal" or (mode.endswith("-later") and nth <= self.normal_answers):
            self._send(
                conn,
                b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s%s\r\n" % (status, len(body), crange, meta)
                + body,
            )
            return True
        mode = mode.removesuffix("-later")
        if mode in ("no-ranges", "ranges-ignored"):  # a 200 and the whole object, always
            accept = b"Accept-Ranges: bytes\r\n" if mode == "ranges-ignored" else b""
            self._send(
                conn,
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s%s\r\n" % (size, accept, meta) + data,
            )
            return True
        if mode == "wrong-content-range":  # another range than asked, labelled as such
            a2, b2 = min(a + 1, size - 1), min(b + 1, size - 1)
            self._send(
                conn,
                b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n"
                b"Content-Range: bytes %d-%d/%d\r\n%s\r\n"
                % (b2 - a2 + 1, a2, b2, size, meta)
                + data[a2 : b2 + 1],
            )
            return True
        if mode == "chunked-and-length":  # RFC 9112: chunked wins over Content-Length
            chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            self._send(
                conn,
                b"HTTP/1.1 %s\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n%s%s\r\n"
                % (status, len(chunked), crange, meta)
                + chunked,
            )
            return False
        if mode == "negative-chunk":
            self._send(
                conn,
                b"HTTP/1.1 %s\r\nTransfer-Encoding: chunked\r\n%s%s\r\n-6\r\nabcdef\r\n"
                % (status, crange, meta),
            )
            return self._linger(conn)
        if mode == "continue":
            self._send(
                conn,
                b"HTTP/1.1 100 Continue\r\n\r\n"
                + b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s%s\r\n"
                % (status, len(body), crange, meta)
                + body,
            )
            return True
        if mode == "no-content":
            self._send(conn, b"HTTP/1.1 204 No Content\r\nConnection: keep-alive\r\n%s\r\n" % meta)
            return True
        if mode == "silent":
            return self._linger(conn)
        if mode == "bare-lf":
            head = b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
                status,
                len(body),
                crange,
                meta,
            )
            self._send(conn, head.replace(b"\r\n", b"\n") + body)
            return True
        if mode == "trickle":
            self._send(
                conn,
                b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s%s\r\n"
                % (status, len(body), crange, meta),
            )
            for k in range(len(body)):
                if self._stop.wait(2.0):
                    return False
                self._send(conn, body[k : k + 1])
            return True
        if mode == "full-200":  # the range ignored: a 200 and a huge body
            self._send(
                conn, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (self.max_bytes, meta)
            )
            return self._flood(conn, self.max_bytes)
        if mode == "huge-length":  # a 206 of the range asked, claiming 10^12 bytes
            self._send(
                conn,
                b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s%s\r\n" % (status, 10**12, crange, meta),
            )
            return self._flood(conn, self.max_bytes)
        if mode == "huge-chunk":
            self._send(
                conn,
                b"HTTP/1.1 %s\r\nTransfer-Encoding: chunked\r\n%s%s\r\n%x\r\n"
                % (status, crange, meta, 10**15),
            )
            return self._flood(conn, self.max_bytes)
        raise ValueError(f"unknown mode {mode!r}")

    def _forward(self, conn: socket.socket, req: Request) -> bool:
        """Sends `req` on to its origin (one connection per request) and relays the
        answer (its `Content-Length` body); the connection to the client stays open."""
        import urllib.parse

        parts = urllib.parse.urlsplit(req.target)
        host = parts.hostname or ""
        head = f"{req.method} {parts.path or '/'} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n"
            for k, v in req.headers.items()
            if k not in ("connection", "proxy-connection")
        )
        with socket.create_connection((host, parts.port or 80), timeout=5) as up:
            up.sendall(head.encode("latin-1") + b"Connection: close\r\n\r\n")
            buf = bytearray()
            while b"\r\n\r\n" not in buf:
                got = up.recv(65536)
                if not got:
                    return False
                buf += got
            end = buf.index(b"\r\n\r\n") + 4
            length = 0
            for line in bytes(buf[:end]).decode("latin-1").split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            while len(buf) < end + length:
                got = up.recv(65536)
                if not got:
                    break
                buf += got
        self._send(conn, bytes(buf[: end + length]))
        return True

    def _linger(self, conn: socket.socket) -> bool:
        """Says nothing more until the client goes or the server stops."""
        while not self._stop.wait(0.2):
            try:
                if conn.recv(65536) == b"":
                    return False
            except TimeoutError:
                continue
            except OSError:
                return False
        return False

    def _flood(self, conn: socket.socket, n: int) -> bool:
        sent = 0
        while sent < n and not self._stop.is_set():
            self._send(conn, _CHUNK)
            sent += len(_CHUNK)
        return False


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def wait_until(cond: object, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False
