"""A small TCP proxy for tests and benchmarks of remote reads: it can drop the first
connections it accepts (a transient failure) and delay every chunk a client sends (the
per-request latency of a far store). Runs an asyncio loop in one thread, so thousands of
delayed requests wait at once."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any


def use_remote_env(monkeypatch: Any, tmp_path: Any, *, block_cache: bool = True) -> None:
    """A test's environment for remote reads: its own cache folder, test credentials (kept
    when set), and with `block_cache=False` no block cache (every read goes to the server).

    The process's block cache is sized from `CHUTE_REMOTE_CACHE_BYTES` when first used, so
    the test gets a fresh one (the one before is put back after it): a cache made by an
    earlier test, with or without `block_cache`, would otherwise hold for this one."""
    import os

    from chute._src.storage.remote import blocks

    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path / "cache"))
    if not block_cache:
        monkeypatch.setenv("CHUTE_REMOTE_CACHE_BYTES", "0")
    monkeypatch.setattr(blocks, "_cache", None)
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, os.environ.get(key, value))


def read_by_blocks(monkeypatch: Any, cache_bytes: int = 64 << 10) -> None:
    """A fresh block cache of `cache_bytes`, smaller than the test's objects: they do not
    fit in it, so a read fetches the blocks it needs, never a whole object, and later
    reads of other parts go to the server (where a changed object is caught)."""
    from chute._src.storage.remote import blocks

    monkeypatch.setenv("CHUTE_REMOTE_CACHE_BYTES", str(cache_bytes))
    monkeypatch.setattr(blocks, "_cache", None)


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target_port`; use as a context manager."""

    def __init__(self, target_port: int, *, delay_s: float = 0.0, drop_first: int = 0) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.drop_remaining = drop_first
        self.dropped = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        fut.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in asyncio.all_tasks(self._loop):
            if task is not asyncio.current_task():
                task.cancel()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.drop_remaining > 0:
            self.drop_remaining -= 1
            self.dropped += 1
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._pipe(reader, up_writer, self.delay_s),
            self._pipe(up_reader, writer, 0.0),
            return_exceptions=True,
        )

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await src.read(1 << 16):
                if delay:
                    await asyncio.sleep(delay)
                dst.write(data)
                await dst.drain()
        finally:
            with contextlib.suppress(Exception):
                dst.close()


class RangeServer:
    """A minimal object server for tests and benchmarks: answers S3's HEAD and (ranged)
    GET of the files under `root` (`/bucket/key` is `root/bucket/key`) over keep-alive
    HTTP/1.1, each answer delayed by `delay_s`. Enough for s3fs to read known keys (no
    listing, no writes, no auth); it shows what the client does when the server is not the
    limit (moto closes every connection after one answer and runs a thread per request).
    An asyncio protocol on one thread, so thousands of delayed answers wait at once.

    Failures, as S3 answers them: `fail_first` GETs get 503 SlowDown (500 InternalError
    with `fail_status=500`); with `expire`, a
    presigned URL past its expiry (`Expires=` or `X-Amz-Date` + `X-Amz-Expires`) gets 403;
    `revoke()` refuses (403) every presigned URL seen so far; `deny` refuses every GET.
    With `listings`, a GET of a folder (`/dir/`) answers an HTML index of links."""

    def __init__(
        self,
        root: str,
        *,
        delay_s: float = 0.0,
        fail_first: int = 0,
        fail_status: int = 503,
        expire: bool = False,
        deny: bool = False,
        listings: bool = False,
    ) -> None:
        self.root = root
        self.listings = listings
        self.delay_s = delay_s
        self.fail_remaining = fail_first
        self.fail_status = fail_status
        self.expire = expire
        self.deny = deny
        self.port = 0
        self.gets = 0  # GETs answered, failures included
        self.range_bytes = 0  # bytes of the 206 answers' bodies
        self.heads = 0  # HEADs answered
        self.refused = 0  # 403s sent
        self.connections = 0  # connections accepted
        self._seen: set[bytes] = set()
        self._revoked: set[bytes] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._files: dict[bytes, bytes] = {}
        self._transports: set[asyncio.BaseTransport] = set()

    def __enter__(self) -> RangeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def open_connections(self) -> int:
        """Client connections open on the server's side now."""
        return len(self._transports)

    def stop_listening(self) -> None:
        """Refuses new connections from now on; those open are still served."""
        asyncio.run_coroutine_threadsafe(self._stop_listening(), self._loop).result(timeout=10)

    async def _stop_listening(self) -> None:
        self._server.close()

    def revoke(self) -> None:
        """Refuses, from now on, every presigned URL this server has seen."""
        self._loop.call_soon_threadsafe(self._revoked.update, set(self._seen))

    async def _start(self) -> None:
        self._server = await self._loop.create_server(
            lambda: _RangeProtocol(self), "127.0.0.1", 0, backlog=4096
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self._server.close()
        for t in list(self._transports):
            t.close()

    def _file(self, path: bytes) -> bytes | None:
        data = self._files.get(path)
        if data is None:
            data = self._read(path)
            if data is not None and not path.endswith(b"/"):  # files are served as first read
                self._files[path] = data
        return data

    def _read(self, path: bytes) -> bytes | None:
        import os
        import urllib.parse

        rel = urllib.parse.unquote(path.decode("latin-1")).lstrip("/")
        full = os.path.normpath(os.path.join(self.root, rel))
        if not full.startswith(os.path.normpath(self.root) + os.sep):
            return None
        if self.listings and path.endswith(b"/") and os.path.isdir(full):
            # An HTML index of links, as web servers list a folder (fsspec's HTTP glob reads it).
            names = sorted(
                n + ("/" if os.path.isdir(os.path.join(full, n)) else "") for n in os.listdir(full)
            )
            links = "".join(f'<a href="{urllib.parse.quote(n)}">{n}</a>\n' for n in names)
            return f"<html><body>\n{links}</body></html>\n".encode()
        if not os.path.isfile(full):
            return None
        with open(full, "rb") as f:
            return f.read()

    def _refusal(self, query: bytes) -> str | None:
        """Why a GET with this query string is refused (403), or None."""
        import calendar
        import time
        import urllib.parse

        if self.deny:
            return "AccessDenied"
        if not query:
            return None
        self._seen.add(query)
        if query in self._revoked:
            return "AccessDenied"
        if self.expire:
            q = urllib.parse.parse_qs(query.decode())
            if "Expires" in q:
                expires = float(q["Expires"][0])
            elif "X-Amz-Date" in q:
                t0 = calendar.timegm(time.strptime(q["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ"))
                expires = t0 + float(q["X-Amz-Expires"][0])
            else:
                return "AccessDenied"
            if time.time() > expires:
                return "AccessDenied"  # S3 says "Request has expired"
        return None

    def answer(self, head: bytes) -> tuple[bytes, bytes | memoryview]:
        """The answer's head and body to a request head (the body a view: no copy)."""
        line, _, rest = head.partition(b"\r\n")
        method, target, _ = line.split(b" ", 2)
        path, _, query = target.partition(b"?")
        data = self._file(path)
        body: bytes | memoryview = b""
        if method == b"GET":
            self.gets += 1
        elif method == b"HEAD":
            self.heads += 1
        if data is None:
            body = b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
            return _reply(b"404 Not Found", b"Content-Type: application/xml\r\n", body)
        if method == b"GET" and self.fail_remaining > 0:
            self.fail_remaining -= 1
            status, code, message = (
                (b"503 Slow Down", b"SlowDown", b"slow down")
                if self.fail_status == 503
                else (b"500 Internal Server Error", b"InternalError", b"an internal error")
            )
            body = b"<Error><Code>%s</Code><Message>%s</Message></Error>" % (code, message)
            return _reply(status, b"Content-Type: application/xml\r\n", body)
        refusal = self._refusal(query) if method == b"GET" else None
        if refusal is not None:
            self.refused += 1
            body = b"<Error><Code>%s</Code></Error>" % refusal.encode()
            return _reply(b"403 Forbidden", b"Content-Type: application/xml\r\n", body)
        extra = b'ETag: "%x"\r\nLast-Modified: Mon, 23 Nov 2026 00:00:00 GMT\r\n' % len(data)
        status, body = b"200 OK", memoryview(data)
        at = rest.lower().find(b"\r\nrange: bytes=")
        if at < 0 and rest.lower().startswith(b"range: bytes="):
            at = -2
        if at != -1:
            spec = rest[at + 15 :].split(b"\r\n", 1)[0]
            a, _, b = spec.partition(b"-")
            start, end = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
            if start >= len(data):  # as S3: no byte there (a 0-byte object)
                body = b"<Error><Code>InvalidRange</Code></Error>"
                return _reply(b"416 Requested Range Not Satisfiable", b"", body)
            body = memoryview(data)[start : end + 1]
            status = b"206 Partial Content"
            if method == b"GET":
                self.range_bytes += len(body)
            extra += b"Content-Range: bytes %d-%d/%d\r\n" % (start, end, len(data))
        if method == b"HEAD":
            return _reply(status, extra, b"", length=len(body))
        return _reply(status, extra, body)


def _reply(
    status: bytes, extra: bytes, body: bytes | memoryview, length: int | None = None
) -> tuple[bytes, bytes | memoryview]:
    n = len(body) if length is None else length
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n%s\r\n" % (status, n, extra), body


class _RangeProtocol(asyncio.Protocol):
    """One client connection of a `RangeServer`: request heads in, answers out in order."""

    def __init__(self, server: RangeServer) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server.connections += 1
        self.server._transports.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.server._transports.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head, self.buf = self.buf[:end], self.buf[end + 4 :]
            reply = self.server.answer(head)
            if self.server.delay_s:
                self.server._loop.call_later(self.server.delay_s, self._send, reply)
            else:
                self._send(reply)

    def _send(self, reply: tuple[bytes, bytes | memoryview]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(reply)


def serve_s3(latencies_ms: list[float], root: str = "") -> None:
    """Runs moto's S3 server and one latency proxy per entry of `latencies_ms` in front of
    it, in this process (a process of their own, so the server's work does not share a GIL
    with the client measured); prints `moto_port proxy_port...` and serves until stdin
    closes."""
    import logging
    import os
    import sys

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    with contextlib.ExitStack() as stack:  # then a RangeServer over `root` per latency
        proxies = [stack.enter_context(TcpProxy(port, delay_s=ms / 1000)) for ms in latencies_ms]
        ranges = [
            stack.enter_context(RangeServer(root, delay_s=ms / 1000)) for ms in latencies_ms if root
        ]
        print(port, *(p.port for p in proxies), *(r.port for r in ranges), flush=True)
        sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    root = args.pop(0)[len("--root=") :] if args and args[0].startswith("--root=") else ""
    serve_s3([float(x) for x in args] or [20.0], root)
