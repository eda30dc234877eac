"""A small TCP proxy for tests and benchmarks of remote reads: it can drop the first
connections it accepts (a transient failure) and delay every chunk a client sends (the
per-request latency of a far store). Runs an asyncio loop in one thread, so thousands of
delayed requests wait at once."""

from __future__ import annotations

import asyncio
import contextlib
import threading


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
    """A minimal object server for benchmarks: answers S3's HEAD and (ranged) GET of the
    files under `root` (`/bucket/key` is `root/bucket/key`) over keep-alive HTTP/1.1, each
    answer delayed by `delay_s`. Enough for s3fs to read known keys (no listing, no
    writes, no auth); it shows what the client does when the server is not the limit
    (moto closes every connection after one answer and runs a thread per request)."""

    def __init__(self, root: str, *, delay_s: float = 0.0) -> None:
        self.root = root
        self.delay_s = delay_s
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._files: dict[str, bytes] = {}

    def __enter__(self) -> RangeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
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
        self._server.close()
        for task in asyncio.all_tasks(self._loop):
            if task is not asyncio.current_task():
                task.cancel()

    def _file(self, path: str) -> bytes | None:
        import os
        import urllib.parse

        rel = urllib.parse.unquote(path.split("?", 1)[0]).lstrip("/")
        full = os.path.normpath(os.path.join(self.root, rel))
        if not full.startswith(os.path.normpath(self.root) + os.sep) or not os.path.isfile(full):
            return None
        if full not in self._files:
            with open(full, "rb") as f:
                self._files[full] = f.read()
        return self._files[full]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)
                }
                if int(headers.get("content-length", 0)):
                    await reader.readexactly(int(headers["content-length"]))
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                data = self._file(path)
                if data is None:
                    body = b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
                    status, extra = "404 Not Found", {"Content-Type": "application/xml"}
                else:
                    status, extra, body = "200 OK", {}, data
                    rng = headers.get("range", "")
                    if rng.startswith("bytes="):
                        a, _, b = rng[6:].partition("-")
                        start, end = int(a), min(int(b) if b else len(data) - 1, len(data) - 1)
                        body = data[start : end + 1]
                        status = "206 Partial Content"
                        extra["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                    extra["ETag"] = f'"{len(data):x}"'
                    extra["Last-Modified"] = "Mon, 23 Nov 2026 00:00:00 GMT"
                    extra["Content-Type"] = "binary/octet-stream"
                out = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}"]
                out += [f"{k}: {v}" for k, v in extra.items()]
                writer.write(("\r\n".join(out) + "\r\n\r\n").encode())
                if method != "HEAD":
                    writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


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
