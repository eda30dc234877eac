"""Requests to obstore stores: ranged GETs, first blocks and listings, all in flight at
once, each batch within a deadline.

Calls go out through obstore's async API on one event loop in a daemon thread
(`chute-remote-io`), so a batch of hundreds of ranges costs one hand-off: obstore sends
them on its own runtime threads, pooling connections per endpoint. The thread waiting for
a batch waits at most `deadline_s()` (`CHUTE_REMOTE_DEADLINE_S`, default 60 s), obstore's
retries included; then the batch is cancelled and each of its requests fails with
`TimeoutError`. The loop's thread is a daemon and no request outlives the process: an
abandoned read holds up the interpreter's exit by nothing.

Every answer's metadata (size, ETag, Last-Modified, version) is handed back with its
bytes, and `read_ranges` checks it against what the object had when it was opened: an
object replaced since is a `Changed` error, never bytes of the new object read through
the old one's index. obstore itself checks that a ranged answer is the range asked for
(a `200` or another range is an error before its body is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any, TypeVar

from chute._src.storage.remote.stores import Located, deadline_s

__all__ = ["Changed", "Meta", "identity_of", "list_prefix", "read_first", "read_ranges", "submit"]

T = TypeVar("T")
Meta = tuple[int, str]
"""An object's identity: (size, its tags: ETag, Last-Modified and version as answered)."""


class Changed(Exception):
    """An answer's metadata differs from the object's when it was opened."""

    def __init__(self, then: Meta, now: Meta) -> None:
        super().__init__(f"size and tags then {then}, now {now}")
        self.then, self.now = then, now


def identity_of(meta: Mapping[str, Any]) -> Meta:
    """(size, tags) of obstore's `ObjectMeta`.

    >>> import datetime as dt
    >>> identity_of({"size": 3, "e_tag": '"ab"', "last_modified": dt.datetime(2026, 1, 2,
    ...     tzinfo=dt.timezone.utc), "version": None})
    (3, 'ETag="ab";Last-Modified=2026-01-02T00:00:00+00:00')
    """
    tags = []
    if meta.get("e_tag"):
        tags.append(f"ETag={meta['e_tag']}")
    modified = meta.get("last_modified")
    if modified is not None:
        tags.append(f"Last-Modified={modified.isoformat()}")
    if meta.get("version"):
        tags.append(f"Version={meta['version']}")
    return int(meta.get("size") or 0), ";".join(tags)


def same(then: Meta, now: Meta) -> bool:
    """Whether an answer (`now`) is from the object as it was opened (`then`). A tag the
    object had must be in every answer, unchanged: an answer without one is refused."""
    if then[0] != now[0]:
        return False
    if not then[1]:
        return True  # the store tells nothing but the size
    return then[1] == now[1]


# -- the event loop thread ---------------------------------------------------------------
_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="chute-remote-io", daemon=True)
            thread.start()
            _loop, _loop_pid = loop, os.getpid()
        return _loop


class Exiting(ConnectionAbortedError):
    """The interpreter is exiting: requests in flight are dropped, new ones refused."""


_in_flight: set[Future[Any]] = set()
_exiting = False


def submit(make: Callable[[], Awaitable[T]]) -> Future[T]:
    """Runs the coroutine `make()` on the loop thread, bounded by the deadline."""
    if _exiting:
        raise Exiting("the interpreter is exiting: no more remote reads")

    async def bounded() -> T:
        return await asyncio.wait_for(make(), deadline_s())

    fut = asyncio.run_coroutine_threadsafe(bounded(), _event_loop())
    with _loop_lock:
        _in_flight.add(fut)
    fut.add_done_callback(_in_flight.discard)
    return fut


def wait(fut: Future[T]) -> T:
    """`fut`'s result; a `TimeoutError` past the deadline (the work is cancelled), an
    `Exiting` error when the interpreter exits meanwhile."""
    try:
        return fut.result(timeout=deadline_s() + 1.0)
    except TimeoutError:  # the deadline, inside the loop or here
        fut.cancel()
        raise
    except CancelledError:
        raise Exiting("the interpreter is exiting: the read was dropped") from None


def _drop_all_at_exit() -> None:
    """Before the interpreter joins its threads (an abandoned iterator's reader among
    them, waiting on a stalled server), every remote read in flight is dropped, so the
    threads waiting for one go on (with an `Exiting` error) at once."""
    global _exiting
    _exiting = True
    with _loop_lock:
        pending = list(_in_flight)
    for fut in pending:
        fut.cancel()


# Run by `threading._shutdown` before it joins non-daemon threads (as concurrent.futures
# does for its pools; later registrations run first): `atexit` would run after the join.
# concurrent.futures' own hook is registered first (when its module is imported), so
# that this one runs before it.
importlib.import_module("concurrent.futures.thread")
with contextlib.suppress(RuntimeError):  # imported while the interpreter exits: too late
    threading._register_atexit(_drop_all_at_exit)  # type: ignore[attr-defined]


def _after_fork_in_child() -> None:
    global _loop, _loop_lock
    _loop = None  # the parent's loop thread is not in this process
    _loop_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- requests ----------------------------------------------------------------------------
async def _get(loc: Located, a: int, b: int) -> tuple[bytes, Meta]:
    import obstore

    result = await obstore.get_async(loc.store, loc.path, options={"range": (a, b)})
    meta = identity_of(result.meta)
    want = b - a
    parts: list[bytes] = []
    got = 0
    # Read as a stream, so that a server sending more than the range asked for (a wrong
    # Content-Length, a huge chunk) costs at most the range and one network read.
    async for chunk in result.stream(min_chunk_size=max(1, want)):
        parts.append(bytes(chunk))
        got += len(chunk)
        if got >= want:
            break
    if got > want:
        raise ValueError(
            f"the server sent more than the {want} bytes of the range [{a}, {b}) asked for"
        )
    return parts[0] if len(parts) == 1 else b"".join(parts), meta


async def _gather(requests: Sequence[tuple[Located, int, int]]) -> list[Any]:
    return await asyncio.gather(
        *(_get(loc, a, b) for loc, a, b in requests), return_exceptions=True
    )


def read_ranges(requests: Sequence[tuple[Located, int, int, Meta]]) -> list[Any]:
    """Each `(object, start, end, identity)` request's bytes, or the exception it ended
    with (`Changed` for an answer from an object that is not the one opened); all in
    flight at once, within the deadline (past it, each unanswered one a `TimeoutError`)."""
    if not requests:
        return []
    try:
        got = wait(submit(lambda: _gather([(loc, a, b) for loc, a, b, _ in requests])))
    except TimeoutError as e:
        return [e] * len(requests)
    out: list[Any] = []
    for (_, _, _, then), answer in zip(requests, got):
        if isinstance(answer, BaseException):
            out.append(answer)
            continue
        data, now = answer
        out.append(data if same(then, now) else Changed(then, now))
    return out


async def _first(loc: Located, n: int) -> tuple[bytes, Meta] | BaseException:
    """The first `n` bytes of the object and its identity; for a 0-byte object (the store
    answers 416: no byte 0 to send) what a HEAD tells, with no bytes."""
    import obstore

    try:
        return await _get(loc, 0, n)
    except Exception as e:
        if " 416 " not in str(e).split("\n", 1)[0]:
            return e
        first_error: BaseException = e
    try:
        ident = identity_of(await obstore.head_async(loc.store, loc.path))
    except Exception as e:
        return e
    return (b"", ident) if ident[0] == 0 else first_error


def read_first(items: Sequence[tuple[Located, int]]) -> list[Any]:
    """For each `(object, n)`: (its first `n` bytes, identity), or the exception its
    reading ended with; all at once, within the deadline."""
    if not items:
        return []

    async def all_first() -> list[Any]:
        return await asyncio.gather(*(_first(loc, n) for loc, n in items))

    try:
        return wait(submit(all_first))
    except TimeoutError as e:
        return [e] * len(items)


def head(loc: Located) -> Meta:
    """The object's identity (one HEAD)."""
    import obstore

    async def one() -> Meta:
        return identity_of(await obstore.head_async(loc.store, loc.path))

    return wait(submit(one))


def list_prefix(loc: Located, limit: int | None = None) -> list[tuple[str, Meta]]:
    """Every object under `loc.path` + '/' (its path in the store, identity), sorted;
    with `limit`, the first that many listed (unsorted)."""
    import obstore

    prefix = loc.path.rstrip("/") + "/" if loc.path else None

    async def listing() -> list[tuple[str, Meta]]:
        out: list[tuple[str, Meta]] = []
        async for batch in obstore.list(loc.store, prefix, chunk_size=min(limit or 1000, 1000)):
            out.extend((m["path"], identity_of(m)) for m in batch)
            if limit is not None and len(out) >= limit:
                return out[:limit]
        return sorted(out)

    return wait(submit(listing))
