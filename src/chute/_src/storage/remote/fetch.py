"""Requests to obstore stores: ranged GETs, first blocks, whole objects, bodies read in
order, and listings, all in flight at once, each batch within a deadline.

Calls go out through obstore's async API on the event loop of `loop.py` (one hand-off for
a batch of hundreds of ranges: obstore sends them on its own runtime threads, pooling
connections per endpoint). The thread waiting for a batch waits at most `deadline_s()`
(`CHUTE_REMOTE_DEADLINE_S`, default 60 s), obstore's retries included; then the batch is
cancelled and each of its requests fails with `TimeoutError`. At exit every request in
flight is cancelled and obstore's threads are out of Python before the interpreter
finalizes (`loop.py`).

Every answer's metadata (size, ETag, Last-Modified, version) is handed back with its
bytes, and `read_ranges` checks it against what the object had when it was opened: an
object replaced since is a `Changed` error, never bytes of the new object read through
the old one's index. obstore itself checks that a ranged answer is the range asked for
(another range is an error before its body is read).

**Servers without ranges.** A server that answers a ranged GET with `200` and the whole
object (Python's `http.server`, many static hosts) makes obstore raise `NotSupportedError`
before the body is read (`refuses_ranges`). Finding or opening such an object reads its
first bytes from a plain GET instead (`First.ranges` is False); the caller then reads it
whole (`read_whole`) or in order (`Body`), never by ranges.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple, TypeVar

from chute._src.storage.remote.loop import native, submit, wait
from chute._src.storage.remote.stores import Located

__all__ = [
    "Body",
    "Changed",
    "First",
    "Meta",
    "head",
    "identity_of",
    "list_prefix",
    "read_first",
    "read_ranges",
    "read_whole",
    "refuses_ranges",
]

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


# -- requests ----------------------------------------------------------------------------
class First(NamedTuple):
    """An object's first bytes, its identity, and whether its server answers ranges."""

    data: bytes
    ident: Meta
    ranges: bool = True


def refuses_ranges(e: BaseException) -> bool:
    """Whether `e` is obstore's refusal of an answer to a ranged GET that came back `200`
    with the whole object: the server does not support ranges."""
    return type(e).__name__ == "NotSupportedError" and "Range request not supported" in str(e)


async def _body(result: Any, want: int) -> bytes:
    """An answer's body up to `want` bytes, read as a stream that stops there, so a server
    sending more than it should (a wrong Content-Length, a huge chunk) costs at most
    `want` and one network read: more than `want` bytes only if the last read brought
    them, fewer if the body ends before."""
    parts: list[bytes] = []
    got = 0
    stream = result.stream(min_chunk_size=max(1, want))
    while got < want:
        try:
            chunk = await native(stream.__anext__)
        except StopAsyncIteration:
            break
        parts.append(bytes(chunk))
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _get(loc: Located, a: int, b: int) -> tuple[bytes, Meta]:
    import obstore

    result = await native(lambda: obstore.get_async(loc.store, loc.path, options={"range": (a, b)}))
    data = await _body(result, b - a)
    if len(data) > b - a:
        raise ValueError(
            f"the server sent more than the {b - a} bytes of the range [{a}, {b}) asked for"
        )
    return data, identity_of(result.meta)


async def _get_plain(loc: Located, n: int, then: Meta | None) -> tuple[bytes, Meta]:
    """The first `n` bytes of the object from a plain GET (no Range), and its identity;
    `then`: the identity it must have (else `Changed`), and then exactly `n` bytes must
    come (`n` is the whole object)."""
    import obstore

    result = await native(lambda: obstore.get_async(loc.store, loc.path))
    meta = identity_of(result.meta)
    if then is not None and not same(then, meta):
        raise Changed(then, meta)
    want = min(n, meta[0])
    data = await _body(result, want)
    if then is None:
        return data[:want], meta
    if len(data) != want:
        more = "more than" if len(data) > want else f"{len(data)} of"
        raise ValueError(f"the server sent {more} the object's {want} bytes")
    return data, meta


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


def read_whole(requests: Sequence[tuple[Located, Meta]]) -> list[Any]:
    """Each `(object, identity)`'s bytes from one plain GET (no Range), or the exception
    it ended with (`Changed` for another object); all at once, within the deadline."""
    if not requests:
        return []

    async def all_whole() -> list[Any]:
        got = await asyncio.gather(
            *(_get_plain(loc, then[0], then) for loc, then in requests), return_exceptions=True
        )
        return [g if isinstance(g, BaseException) else g[0] for g in got]

    try:
        return wait(submit(all_whole))
    except TimeoutError as e:
        return [e] * len(requests)


async def _first(loc: Located, n: int) -> First | BaseException:
    """The first `n` bytes of the object and its identity: from a ranged GET; from a plain
    one if the server refuses ranges; for a 0-byte object (the store answers 416: no
    byte 0 to send) what a HEAD tells, with no bytes."""
    import obstore

    try:
        return First(*await _get(loc, 0, n))
    except Exception as e:
        if refuses_ranges(e):
            try:
                return First(*await _get_plain(loc, n, None), ranges=False)
            except Exception as plain:
                return plain
        if " 416 " not in str(e).split("\n", 1)[0]:
            return e
        first_error: BaseException = e
    try:
        ident = identity_of(await native(lambda: obstore.head_async(loc.store, loc.path)))
    except Exception as e:
        return e
    return First(b"", ident) if ident[0] == 0 else first_error


def read_first(items: Sequence[tuple[Located, int]]) -> list[First | BaseException]:
    """For each `(object, n)`: its first `n` bytes, identity and whether its server answers
    ranges (`First`), or the exception its reading ended with; all at once, within the
    deadline."""
    if not items:
        return []

    async def all_first() -> list[First | BaseException]:
        return await asyncio.gather(*(_first(loc, n) for loc, n in items))

    try:
        return wait(submit(all_first))
    except TimeoutError as e:
        return [e] * len(items)


def head(loc: Located) -> Meta:
    """The object's identity (one HEAD)."""
    import obstore

    async def one() -> Meta:
        return identity_of(await native(lambda: obstore.head_async(loc.store, loc.path)))

    return wait(submit(one))


def list_prefix(loc: Located, limit: int | None = None) -> list[tuple[str, Meta]]:
    """Every object under `loc.path` + '/' (its path in the store, identity), sorted;
    with `limit`, the first that many listed (unsorted)."""
    import obstore

    prefix = loc.path.rstrip("/") + "/" if loc.path else None

    async def listing() -> list[tuple[str, Meta]]:
        out: list[tuple[str, Meta]] = []
        stream = obstore.list(loc.store, prefix, chunk_size=min(limit or 1000, 1000))
        while True:
            try:
                batch = await native(stream.__anext__)
            except StopAsyncIteration:
                break
            out.extend((m["path"], identity_of(m)) for m in batch)
            if limit is not None and len(out) >= limit:
                return out[:limit]
        return sorted(out)

    return wait(submit(listing))


class Body:
    """An object's bytes in order from one plain GET (no Range): how a stream reads an
    object whose server refuses ranges. The next chunk (of `chunk` bytes) is asked for
    while one is consumed; every byte must come, from the object as opened (its
    identity `then`), else the read is an error (`Changed` for another object)."""

    def __init__(self, loc: Located, then: Meta, chunk: int = 1 << 20) -> None:
        self.loc, self.then, self.chunk = loc, then, chunk
        self.pos = 0  # bytes handed out
        self._buf = b""
        self._stream: Any = None
        self._done = then[0] == 0
        self._next: Future[bytes] | None = None if self._done else submit(self._open)

    async def _open(self) -> bytes:
        import obstore

        result = await native(lambda: obstore.get_async(self.loc.store, self.loc.path))
        now = identity_of(result.meta)
        if not same(self.then, now):
            raise Changed(self.then, now)
        self._stream = result.stream(min_chunk_size=self.chunk)
        return await self._chunk()

    async def _chunk(self) -> bytes:
        try:
            return bytes(await native(self._stream.__anext__))
        except StopAsyncIteration:
            return b""

    def read(self, n: int) -> bytes:
        """The next `n` bytes (fewer only at the end of the object)."""
        size = self.then[0]
        while len(self._buf) < n and not self._done:
            assert self._next is not None
            chunk = wait(self._next)
            got = self.pos + len(self._buf) + len(chunk)
            if got > size:
                raise ValueError(f"the server sent more than the object's {size} bytes")
            if not chunk and got < size:
                raise ValueError(f"the server sent {got} of the object's {size} bytes")
            self._buf += chunk
            self._done = got >= size
            self._next = None if self._done else submit(self._chunk)
        out, self._buf = self._buf[:n], self._buf[n:]
        self.pos += len(out)
        return out

    def close(self) -> None:
        if self._next is not None:
            self._next.cancel()
        self._next, self._done, self._buf = None, True, b""
