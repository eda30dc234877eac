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


def serve_s3(latencies_ms: list[float]) -> None:
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
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(TcpProxy(port, delay_s=ms / 1000)) for ms in latencies_ms]
        print(port, *(p.port for p in proxies), flush=True)
        sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    import sys

    serve_s3([float(x) for x in sys.argv[1:]] or [20.0])
