"""The event loop that obstore's requests are awaited on, and its orderly end at exit.

Requests go out through obstore's async API on one event loop in a thread of its own
(`chute-remote-io`): a batch of hundreds of ranges costs one hand-off, and obstore sends
them on its own runtime (tokio) threads. `submit` runs a coroutine there, bounded by the
deadline (`CHUTE_REMOTE_DEADLINE_S`); `wait` waits for its result.

**Exit.** An obstore future is completed by one of obstore's native threads: once its
request ends, that thread takes the GIL, asks the future whether it was cancelled and, if
not, schedules the result with `loop.call_soon_threadsafe`, which writes to the loop's
wake-up socket (releasing the GIL and taking it back). The loop can run the result, and
the thread that waited for it go on and end the program, while the native thread is
still inside `call_soon_threadsafe`. If the interpreter starts finalizing then, Python
ends that thread with `pthread_exit` when it retakes the GIL, which unwinds through Rust
frames and aborts the process: SIGABRT at exit, nothing printed (as lancedb#4175 met).
Finishing every read is not enough.

So the loop knows the futures obstore made on it that no native thread has handed back
yet (`unsettled`): those made inside `native(...)`, handed back when their native thread
returns from `call_soon_threadsafe` or finds them cancelled. An ordinary `atexit` hook
(it runs once the interpreter has joined its non-daemon threads and before it
finalizes) refuses new requests, cancels those in flight, waits with the GIL released
until every native future is handed back (at most `EXIT_WAIT_S`), then stops the loop
and joins its thread. The hook is the only process-wide effect here; it does nothing in
a process that never read a URL.

**Idle.** The loop's thread ends by itself once no request has been in flight for
`IDLE_S`, so a process that read URLs and closed its iterators is left with no thread of
chute's; the next request starts a new one.

A thread other than the main one that waits for a read once the main thread has ended
(the interpreter is exiting: it joins the threads that are not daemons next) drops it
with an `Exiting` error, so an abandoned iterator reading a stalled server does not hold
up the exit until its deadline; the main thread itself (`atexit` hooks) waits as ever.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import CancelledError, Future
from typing import Any, TypeVar

from chute._src import process_effects
from chute._src.storage.remote.urls import deadline_s

__all__ = ["EXIT_WAIT_S", "Exiting", "native", "submit", "wait"]

T = TypeVar("T")
IDLE_S = 2.0
"""How long the loop's thread waits with no request in flight before it ends."""
EXIT_WAIT_S = 5.0
"""The most the exit hook waits for obstore's native threads to hand their futures back
(they do at once: every request is cancelled first)."""
_POLL_S = 0.1  # how often a thread waiting for a read checks that the main thread runs


class Exiting(ConnectionAbortedError):
    """The interpreter is exiting: requests in flight are dropped, new ones refused."""


class NativeFuture(asyncio.Future[Any]):
    """A future that one of obstore's native threads completes (made in `native`)."""

    def cancelled(self) -> bool:
        out = super().cancelled()
        loop = self.get_loop()
        if out and isinstance(loop, _Loop) and threading.get_ident() != loop.ident:
            loop.unsettled.discard(self)  # its native thread found it cancelled: done
        return out


class _Loop(asyncio.SelectorEventLoop):
    """An event loop that tells which of obstore's futures a native thread still holds."""

    def __init__(self) -> None:
        super().__init__()
        self.ident = 0  # the thread running it
        self.making = 0  # above 0 while `native` calls obstore (on the loop's thread)
        self.unsettled: set[asyncio.Future[Any]] = set()

    def create_future(self) -> asyncio.Future[Any]:
        if self.making:
            fut = NativeFuture(loop=self)
            self.unsettled.add(fut)
            return fut
        return super().create_future()

    def call_soon_threadsafe(  # type: ignore[override]
        self,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        finally:
            if args and type(args[0]) is NativeFuture:
                self.unsettled.discard(args[0])  # its result is scheduled: handed back

    def run(self) -> None:
        self.ident = threading.get_ident()
        self.call_later(IDLE_S, self._end_if_idle)
        try:
            self.run_forever()
        finally:
            if not self.unsettled:  # no native thread can reach it any more
                self.close()

    def _end_if_idle(self) -> None:
        """Stops the loop (its thread then ends) once no request has been in flight for
        `IDLE_S` and no native thread holds one of its futures; else looks again later."""
        global _loop, _thread
        with _lock:
            if _loop is not self:
                return
            idle_for = time.monotonic() - _last_request
            if _pending == 0 and not self.unsettled and idle_for >= IDLE_S:
                _loop = _thread = None  # the next request starts another loop
                self.stop()
                return
        self.call_later(max(0.05, IDLE_S - idle_for), self._end_if_idle)


def native(call: Callable[[], Awaitable[T]]) -> Awaitable[T]:
    """`call()`, an obstore call that returns an awaitable (`get_async`, a stream's
    `__anext__`, ...), made so that the loop knows its future until a native thread
    hands it back. Only on the loop's thread, in a coroutine `submit` runs."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, _Loop):
        return call()
    loop.making += 1
    try:
        return call()
    finally:
        loop.making -= 1


_loop: _Loop | None = None
_thread: threading.Thread | None = None
_loop_pid = 0
_lock = threading.Lock()
_exiting = False
_pending = 0  # requests submitted and not yet done
_last_request = 0.0  # when the last one ended (time.monotonic())


def _event_loop() -> _Loop:
    """The running loop, started if there is none (with `_lock` held)."""
    global _loop, _thread, _loop_pid
    if _exiting:
        raise Exiting("the interpreter is exiting: no more remote reads")
    if _loop is None or _loop_pid != os.getpid():
        process_effects.register_once(
            "remote-loop", at_exit=_end_at_exit, after_in_child=_after_fork_in_child
        )
        loop = _Loop()
        thread = threading.Thread(target=loop.run, name="chute-remote-io", daemon=True)
        thread.start()
        _loop, _thread, _loop_pid = loop, thread, os.getpid()
    return _loop


def submit(make: Callable[[], Awaitable[T]]) -> Future[T]:
    """Runs the coroutine `make()` on the loop's thread, bounded by the deadline."""
    global _pending

    async def bounded() -> T:
        return await asyncio.wait_for(make(), deadline_s())

    with _lock:  # the loop cannot end between being chosen and being given the request
        fut = asyncio.run_coroutine_threadsafe(bounded(), _event_loop())
        _pending += 1
    fut.add_done_callback(_request_ended)
    return fut


def _request_ended(_: Future[Any]) -> None:
    global _pending, _last_request
    with _lock:
        _pending -= 1
        _last_request = time.monotonic()


def wait(fut: Future[T]) -> T:
    """`fut`'s result; a `TimeoutError` past the deadline (the work is cancelled), an
    `Exiting` error when the interpreter exits meanwhile."""
    end = time.monotonic() + deadline_s() + 1.0
    main = threading.main_thread()
    poll = threading.current_thread() is not main
    while True:
        try:
            return fut.result(timeout=_POLL_S if poll else max(0.0, end - time.monotonic()))
        except TimeoutError:  # the deadline, inside the loop or here; or a poll
            if fut.done():
                raise  # the deadline, inside the loop: the request was cancelled there
            if time.monotonic() >= end:
                fut.cancel()
                raise
            if not main.is_alive():
                fut.cancel()
                raise Exiting("the interpreter is exiting: the read was dropped") from None
        except CancelledError:
            raise Exiting("the interpreter is exiting: the read was dropped") from None


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _end_at_exit() -> None:
    """Refuses new requests, cancels those in flight, waits until obstore's native threads
    have handed back every future (the GIL released), then stops the loop and joins its
    thread: no native thread is in Python when the interpreter finalizes."""
    global _exiting
    with _lock:
        _exiting = True
        loop, thread = _loop, _thread
    if loop is None or thread is None or _loop_pid != os.getpid() or not thread.is_alive():
        return
    end = time.monotonic() + EXIT_WAIT_S
    try:
        asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(timeout=EXIT_WAIT_S)
    except Exception:  # cancelled reads end in errors; the wait is bounded
        pass
    while loop.unsettled and time.monotonic() < end:
        time.sleep(0.001)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=max(0.0, end - time.monotonic()))


def _after_fork_in_child() -> None:
    global _loop, _thread, _lock, _pending
    _loop = _thread = None
    _pending = 0  # the parent's loop thread is not in this process
    _lock = threading.Lock()
