"""`RemoteFile`: one object of a remote store, read by byte ranges through the block cache.

Opening asks the store for the object's size and identity (ETag, version or mtime) once:
for an object the range client reads (s3, http), by a GET of its first block, whose
answer carries the size (`Content-Range`) and the ETag, so the block is in the cache and
opening costs one round trip; else (and for a 0-byte, missing or directory object, to
tell which) by the file system's `info` (for s3fs a HEAD, milliseconds of CPU).
`read_ranges` serves a list of byte ranges with as few round trips as it can: the blocks
they need that the cache lacks are grouped into runs (adjacent or nearby blocks become
one request), and all runs are fetched at once: through chute's own range client
(`ranges.py`) for s3 and http(s) objects, else through the file system's async
`cat_ranges` where it has one (gcsfs: hundreds of requests in flight without a thread
each), else through a shared thread pool. A read that fails or comes back short
asks the store again for the object's identity, so an object replaced or removed since it
was opened is named as such (`DataError`), rather than as corrupt data.

A `RemoteFile` stands in for a mapped local file in chute's readers: slicing it
(`f[a:b]`) returns bytes, `len(f)` is the size, and it has a `FileGuard`'s reading
interface (`leased` is True: a remote object cannot shrink under a mapping, so there is
no size check; `check`, `check_once` and `close` cost nothing).
"""

from __future__ import annotations

import io
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from chute._src.errors import DataError, MissingFileError
from chute._src.remote import blocks
from chute._src.remote.calls import call, failure, is_transient, logger, max_retries
from chute._src.remote.urls import StorageOptions, filesystem, is_url, options_key

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    from chute._src.remote import ranges

# The range client (`ranges`, `wire`: sockets, TLS) and the thread pool are imported when
# a remote object is first read: a process reading local files only (a worker process
# among them) does not load them.

__all__ = ["RemoteFile", "RemoteReader", "find_objects", "open_concurrently", "read_many"]
T = TypeVar("T")

_GAP_BLOCKS = 2  # missing blocks this close together are fetched in one request
_MAX_RUN = 16 << 20  # the longest request a run grows to
_THREADS = 32
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(_THREADS, thread_name_prefix="chute-remote")
        return _pool


def _after_fork_in_child() -> None:
    global _pool, _pool_lock, _found_lock
    _pool = None  # the parent's threads do not exist here
    _pool_lock = threading.Lock()
    _found_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def open_concurrently(open_one: Callable[[int], T], paths: Sequence[str]) -> list[T]:
    """`[open_one(k) for k in range(len(paths))]`, run concurrently when several paths are
    URLs (opening one costs a few round trips); closes what opened when one fails (objects
    with a `close`) and raises the first error."""
    if sum(map(is_url, paths)) < 2:
        return [open_one(k) for k in range(len(paths))]
    # No object is read whole while some are opening: whether they all fit is not known
    # until every one is open and counted.
    with blocks.open_objects.opening():
        futures = [_thread_pool().submit(open_one, k) for k in range(len(paths))]
        out: list[T] = []
        error: BaseException | None = None
        for fut in futures:
            try:
                out.append(fut.result())
            except BaseException as e:
                error = error or e
    if error is not None:
        for f in out:
            close = getattr(f, "close", None)
            if close is not None:
                close()
        raise error
    return out


def find_objects(urls: Sequence[str], storage_options: StorageOptions) -> list[bool]:
    """For each URL, whether it is known to name an object: its first block (the first
    byte, past the first `_FIRST_BLOCKS` URLs) was asked for through the range client,
    all at once (one round trip for the lot, no HEAD; a 416 answer is a 0-byte object).
    False means not known: not read by the range client, or the answer was not that
    (missing, a directory, a failure): `fs.info` tells.

    An object found so keeps what its answer told (size and ETag; its presigned URL is
    kept by `ranges`, its first block by the block cache) until this process opens it
    (`RemoteFile`), which then costs no request: the object is opened when found, and a
    read that finds it replaced since is a `DataError`. Until then (at most `_HOLD_S`),
    the connections that found it are kept for its first reads; nothing else is kept."""
    from chute._src.remote import ranges
    from chute._src.remote.wire import HTTPStatusError

    found = [False] * len(urls)
    asked: list[tuple[int, ranges.Target]] = []
    systems = [filesystem(url, storage_options) for url in urls]
    by_fs: dict[Any, list[str]] = {}
    for fs, path in systems:
        by_fs.setdefault(fs, []).append(path)
    for fs, paths in by_fs.items():
        if ranges.target_protocol(fs) == "s3":
            try:
                ranges.presign_all(fs, paths)
            except Exception:  # each is signed again below, and its error named there
                pass
    for k, (url, (fs, path)) in enumerate(zip(urls, systems)):
        try:
            t = ranges.target(url, fs, path)
        except Exception:  # cannot sign here: `fs.info` gives the error
            continue
        if t is not None:
            asked.append((k, t))
    bs = blocks.block_bytes()
    ends = [bs if n < _FIRST_BLOCKS else 1 for n in range(len(asked))]
    got = ranges.fetch([(t, 0, end) for (_, t), end in zip(asked, ends)]) if asked else []
    opts = options_key(storage_options)
    store = blocks.cache()
    for (k, t), end, answer in zip(asked, ends, got):
        if isinstance(answer, bytes):
            found[k] = True
            _keep_found((urls[k], opts), t)
            if end == bs and len(answer) == min(bs, t.size):
                store.put((_block_key(urls[k], opts, _target_identity(t)), 0), answer)
        elif isinstance(answer, HTTPStatusError) and answer.status == 416:
            found[k] = True
    return found


_FIRST_BLOCKS = 256  # objects whose first block is read when found (the first to open)
_FOUND_MAX = 1 << 16  # objects found and not opened yet, kept (oldest dropped first)
_HOLD_S = 20.0  # how long a found object's target (its connections) is kept for opening
# (url, options) -> (size, ETag) of an object found and not opened yet, and its target
# while younger than _HOLD_S (which keeps its endpoint's connections open).
_found: OrderedDict[tuple[str, str], tuple[int, str, ranges.Target | None, float]] = OrderedDict()
_held: OrderedDict[tuple[str, str], None] = OrderedDict()  # keys of _found holding a target
_found_lock = threading.Lock()


def _keep_found(key: tuple[str, str], t: ranges.Target) -> None:
    now = time.monotonic()
    with _found_lock:
        _found[key] = (t.size, t.etag, t, now)
        _found.move_to_end(key)
        _held[key] = None
        _held.move_to_end(key)
        while len(_found) > _FOUND_MAX:
            _held.pop(_found.popitem(last=False)[0], None)
        _release_old(now)


def _take_found(key: tuple[str, str]) -> tuple[int, str, ranges.Target | None] | None:
    """What finding the object told, and its target while kept, or None."""
    with _found_lock:
        _release_old(time.monotonic())
        _held.pop(key, None)
        got = _found.pop(key, None)
        return None if got is None else got[:3]


def _release_old(now: float) -> None:
    """Drops the targets found more than `_HOLD_S` ago (under `_found_lock`)."""
    while _held:
        key = next(iter(_held))
        size, etag, _, at = _found[key]
        if now - at < _HOLD_S:
            break
        _found[key] = (size, etag, None, at)
        del _held[key]


def _target_identity(t: ranges.Target) -> tuple[int, str]:
    return t.size, f"ETag={t.etag}" if t.etag else ""


def _block_key(url: str, opts: str, identity: tuple[int, str]) -> Hashable:
    """What an object's blocks are cached under: blocks are shared by readers of the same
    object (`identity`: size and ETag, ...) through the same store options only."""
    return (url, opts, identity)


def _identity(info: dict[str, Any]) -> tuple[int, str]:
    """(size, the first of ETag / version / mtime the store reports) of an fsspec info."""
    from chute._src.remote.wire import etag_value

    size = int(info.get("size") or 0)
    for key in ("ETag", "etag"):
        if info.get(key):
            return size, f"ETag={etag_value(str(info[key]))}"
    for key in ("VersionId", "version_id", "generation", "md5Hash"):
        if info.get(key):
            return size, f"{key}={info[key]}"
    for key in ("LastModified", "mtime", "updated", "last_modified", "created"):
        if info.get(key):
            return size, f"{key}={info[key]}"
    return size, ""


def _etag(identity: tuple[int, str]) -> str:
    return identity[1][5:] if identity[1].startswith("ETag=") else ""


def _same(then: tuple[int, str], now: tuple[int, str]) -> bool:
    """Whether an object's identity now is the one it had when opened. An object opened
    by its first GET knows its ETag, or nothing but its size when the server sends none."""
    return then == now or (then[0] == now[0] and not then[1])


class RemoteFile:
    """A remote object read by ranges. Raises `DataError` naming `url` when it is
    missing, a directory, unreachable (after bounded retries) or not readable."""

    leased = True  # what FileGuard readers test: no size check is needed
    fd = -1

    def __init__(self, url: str, storage_options: StorageOptions, what: str) -> None:
        from chute._src.remote import ranges

        self.url = url
        self.path = url
        self.what = what
        self.fs, self._fspath = filesystem(url, storage_options)
        # Where chute's own range client reads it (s3, http), or None: through fsspec.
        # An object `find_objects` just found is opened already (maybe on its
        # connections, with its first block in the cache).
        opts = options_key(storage_options)
        found = _take_found((url, opts))
        size, etag, held = found or (-1, "", None)
        if held is not None and ranges.target_protocol(self.fs) is not None:
            self.target: ranges.Target | None = held
        else:
            self.target = call(
                url,
                "locate it for range reads",
                lambda: ranges.target(url, self.fs, self._fspath, size, etag),
            )
        if self.target is None:
            found = None  # CHUTE_REMOTE_HTTP=fsspec since it was found
        first = self._first_block() if self.target is not None and not found else None
        if first is None and not found:
            self.identity = self._info_identity()
            if self.target is not None:
                self.target.size, self.target.etag = self.identity[0], _etag(self.identity)
        else:
            assert self.target is not None
            self.identity = _target_identity(self.target)
        self.size = self.identity[0]
        self.key = _block_key(url, opts, self.identity)
        store = blocks.cache()
        if first:
            store.put((self.key, 0), first)
        blocks.open_objects.opened(self.key, self.size)  # counted until closed or collected
        self._opened = weakref.finalize(self, blocks.open_objects.closed, self.key)

    def _first_block(self) -> bytes | None:
        """The object's first block, read through the range client, which learns its
        size and ETag from the answer: opening costs one GET and no HEAD. None when
        that cannot tell (a 0-byte object, a missing object or a directory: `fs.info`
        names which)."""
        from chute._src.remote import ranges
        from chute._src.remote.wire import HTTPStatusError

        assert self.target is not None
        t = self.target
        bs = blocks.block_bytes()

        def once() -> bytes | None:
            got = ranges.fetch([(t, 0, bs)])[0]
            if isinstance(got, HTTPStatusError) and got.status == 416:
                return None  # no byte 0: a 0-byte object
            if isinstance(got, BaseException):
                raise got
            data: bytes = got
            return data

        try:
            return call(self.url, f"open it as {self.what}", once)
        except MissingFileError:
            return None

    def _info_identity(self) -> tuple[int, str]:
        """(size, identity) from the file system's `info` (a HEAD for s3); `DataError`
        for a missing object or a directory."""
        info = call(self.url, f"open it as {self.what}", lambda: self.fs.info(self._fspath))
        if info.get("type") == "directory":
            raise DataError(
                f"{self.url}: it is a directory, not an object: cannot read it as "
                f"{self.what}; name the object(s) inside it, or a glob pattern"
            )
        return _identity(info)

    # -- the FileGuard reading interface -------------------------------------------------
    def check(self, record: int | None = None) -> None:
        pass

    def error(self, record: int | None = None) -> DataError:
        """Why a read failed: the object changed or went away, or the store failed."""
        return self.changed_error() or DataError(
            f"{self.url}: a read failed; the store is failing; reopen the source"
        )

    def mapping(self) -> RemoteFile:
        """What readers slice for bytes: a local file's map, this object itself."""
        return self

    def check_once(self, checked: set[int], record: int | None = None) -> None:
        pass

    def close(self) -> None:
        self._opened()

    def explain(self, err: DataError) -> DataError:
        """`err` (a read that failed its checks), or why: the object changed since opened."""
        return self.changed_error() or err

    def changed_error(self) -> DataError | None:
        """A DataError if the object is gone or differs from when it was opened, else None."""
        try:
            self.fs.invalidate_cache(self._fspath)
            info = call(self.url, "check it", lambda: self.fs.info(self._fspath))
        except FileNotFoundError:  # MissingFileError
            return DataError(
                f"{self.url}: the object was removed after chute opened it as {self.what}; "
                "a dataset must stay in place while it is read: restore it and reopen the "
                "source"
            )
        now = _identity(info)
        if _same(self.identity, now):
            return None
        return DataError(
            f"{self.url}: the object changed after chute opened and indexed it (size and "
            f"tag then {self.identity}, now {now}); a dataset must not be rewritten in "
            "place while it is read: write new objects under new names, then reopen the "
            "source"
        )

    # -- reads ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.size

    def __getitem__(self, s: slice) -> bytes:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError(f"RemoteFile reads byte ranges (f[a:b]); got {s!r}")
        start, stop, _ = s.indices(self.size)
        return self.read_ranges([(start, stop)])[0]

    def read_ranges(self, ranges: Sequence[tuple[int, int]], *, cache: bool = True) -> list[bytes]:
        """The bytes of each `(start, end)` range (clipped to the object), fetched at once;
        `cache=False`: fetched exactly, past the block cache (a stream reads once)."""
        return read_many([(self, a, b) for a, b in ranges], cache=cache)

    def reader(self, buffer_size: int = 1 << 20, *, sequential: bool = False) -> io.BufferedReader:
        """A seekable binary file object over the object (reads go through `read_ranges`);
        `sequential`: each window of `buffer_size` bytes read ahead of the reads."""
        raw = RemoteReader(self, ahead=buffer_size if sequential else 0)
        return io.BufferedReader(raw, buffer_size=buffer_size)

    def cached(self, start: int, end: int) -> bytes:
        """The bytes from `start` (up to `end`) that the block cache holds, without a
        request: those of the blocks there in a row from `start`'s, maybe none."""
        bs = blocks.block_bytes()
        store = blocks.cache()
        parts: list[bytes] = []
        n = start // bs
        while n * bs < end:
            block = store.get((self.key, n))
            if block is None:
                break
            parts.append(block)
            n += 1
        if not parts:
            return b""
        base = (start // bs) * bs
        return b"".join(parts)[start - base : end - base]

    def __repr__(self) -> str:
        return f"RemoteFile({self.url!r}, size={self.size})"


def _runs(wanted: list[int], bs: int) -> list[tuple[int, int]]:
    """Sorted block numbers grouped into runs `(first, last)` of nearby blocks."""
    runs: list[tuple[int, int]] = []
    max_blocks = max(1, _MAX_RUN // bs)
    for n in wanted:
        if runs and n - runs[-1][1] <= _GAP_BLOCKS and n - runs[-1][0] < max_blocks:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def read_many(items: Sequence[tuple[RemoteFile, int, int]], *, cache: bool = True) -> list[bytes]:
    """The bytes of each `(file, start, end)`, across any number of objects, with one
    concurrent fetch for all the blocks the cache lacks (nearby blocks coalesced), or, while
    every object open fits in the cache (`BlockCache.holds_all`), for the whole objects
    missing, kept whole; what another thread is fetching is waited for, not fetched again.
    With `cache=False`, each range fetched as it is, the cache neither asked nor filled."""
    bs = blocks.block_bytes()
    store = blocks.cache()
    cache_on = cache and store.max_bytes > 0
    if cache_on:
        hit = _all_cached(store, items, bs)
        if hit is not None:
            return hit
        if store.holds_all():
            _fetch_whole(store, items)
            hit = _all_cached(store, items, bs)
            if hit is not None:
                return hit
    direct_limit = 16 * bs
    have: dict[tuple[int, int], bytes] = {}  # (id(file), block) -> block
    wanted: dict[int, set[int]] = {}
    files: dict[int, RemoteFile] = {}
    clipped: list[tuple[RemoteFile, int, int]] = []
    direct: list[int] = []  # ranges too long for the cache: fetched exactly
    wholes: dict[RemoteFile, bytes | None] = {}  # objects the cache keeps whole
    for k, (f, a, b) in enumerate(items):
        a, b = max(0, min(a, f.size)), max(0, min(b, f.size))
        clipped.append((f, a, b))
        if b <= a:
            continue
        if b - a > direct_limit or not cache_on:
            direct.append(k)
            continue
        if f not in wholes:
            wholes[f] = store.get((f.key, blocks.WHOLE))
        if wholes[f] is not None:
            continue
        fid = id(f)
        files[fid] = f
        want = wanted.setdefault(fid, set())
        for n in range(a // bs, (b - 1) // bs + 1):
            if (fid, n) not in have and n not in want:
                block = store.get((f.key, n))
                if block is None:
                    want.add(n)
                else:
                    have[fid, n] = block
    wanted = {fid: want for fid, want in wanted.items() if want}
    fetched = _fetch_blocks(store, files, wanted, have, [clipped[k] for k in direct])
    direct_data = dict(zip(direct, fetched))
    out: list[bytes] = []
    for k, (f, a, b) in enumerate(clipped):
        if b <= a:
            out.append(b"")
        elif k in direct_data:
            out.append(direct_data[k])
        elif (whole := wholes.get(f)) is not None:
            out.append(whole[a:b])
        else:
            fid = id(f)
            n0, n1 = a // bs, (b - 1) // bs
            if n0 == n1:
                out.append(have[fid, n0][a - n0 * bs : b - n0 * bs])
            else:
                joined = b"".join(have[fid, n] for n in range(n0, n1 + 1))
                out.append(joined[a - n0 * bs : b - n0 * bs])
    return out


def _all_cached(
    store: blocks.BlockCache, items: Sequence[tuple[RemoteFile, int, int]], bs: int
) -> list[bytes] | None:
    """Each range's bytes when the cache holds them all (the common case once it holds a
    dataset): sliced from the objects kept whole, or from blocks, taken under one lock;
    else None."""
    wholes: dict[RemoteFile, bytes | None] = {}
    keys: list[Hashable] = []
    if not all(0 <= a < b <= f.size for f, a, b in items):  # clipped to the objects
        clipped = [(f, max(0, min(a, f.size)), max(0, min(b, f.size))) for f, a, b in items]
        inside = _all_cached(store, [(f, a, b) for f, a, b in clipped if a < b], bs)
        if inside is None:
            return None
        parts = iter(inside)
        return [next(parts) if a < b else b"" for _, a, b in clipped]
    for f, a, b in items:
        whole = wholes.get(f, _UNSEEN)
        if whole is _UNSEEN:
            whole = wholes[f] = store.get((f.key, blocks.WHOLE))
        if whole is not None:
            continue
        n0, n1 = a // bs, (b - 1) // bs
        if n0 == n1:
            keys.append((f.key, n0))
        elif n1 - n0 < 16:
            keys += [(f.key, n) for n in range(n0, n1 + 1)]
        else:
            return None  # a long range: fetched exactly, past the cache
    got = store.get_many(keys) if keys else []
    if got is None:
        return None
    out: list[bytes] = []
    append = out.append
    k = 0
    for f, a, b in items:
        whole = wholes[f]
        if whole is not None:
            append(whole[a:b])
            continue
        n0, n1 = a // bs, (b - 1) // bs
        base = n0 * bs
        if n0 == n1:
            append(got[k][a - base : b - base])
            k += 1
        else:
            append(b"".join(got[k : k + n1 - n0 + 1])[a - base : b - base])
            k += n1 - n0 + 1
    return out


_UNSEEN: Any = object()


def _fetch_whole(store: blocks.BlockCache, items: Sequence[tuple[RemoteFile, int, int]]) -> None:
    """Puts in the cache, whole, each object of `items` it does not hold whole: those no
    other thread is fetching are fetched here (in requests of up to `_MAX_RUN` bytes, all
    in flight at once), the others waited for."""
    files = {f: None for f, a, b in items if a < b and (f.key, blocks.WHOLE) not in store}
    mine, waits = store.claim([(f.key, blocks.WHOLE) for f in files])
    claimed = set(mine)
    try:
        todo = [f for f in files if (f.key, blocks.WHOLE) in claimed]
        parts = [
            (f, a, min(a + _MAX_RUN, f.size)) for f in todo for a in range(0, f.size, _MAX_RUN)
        ]
        fetched = iter(_fetch(parts)) if parts else iter(())
        for f in todo:
            pieces = [next(fetched) for _ in range(0, f.size, _MAX_RUN)]
            store.put((f.key, blocks.WHOLE), pieces[0] if len(pieces) == 1 else b"".join(pieces))
    finally:
        store.release(mine)
    for event in waits:
        event.wait()


def _fetch_blocks(
    store: blocks.BlockCache,
    files: dict[int, RemoteFile],
    wanted: dict[int, set[int]],
    have: dict[tuple[int, int], bytes],
    direct: list[tuple[RemoteFile, int, int]],
) -> list[bytes]:
    """Puts the `wanted` blocks of each file in `have` (and the cache): those no other
    thread is fetching are fetched here, in one concurrent fetch with the `direct` ranges
    (whose bytes it returns); then those another thread was fetching are waited for, and
    any it failed to fetch (or evicted since) are fetched here."""
    claimed: list[Hashable] = []
    waits: list[threading.Event] = []
    mine: dict[int, list[int]] = {}
    for fid, want in wanted.items():
        key = files[fid].key
        got, events = store.claim([(key, n) for n in sorted(want)])
        claimed += got
        waits += events
        mine[fid] = [cast(tuple[Any, int], k)[1] for k in got]
    try:
        fetched = _fetch_runs(store, files, mine, have, direct)
    finally:
        store.release(claimed)
    for event in waits:
        event.wait()
    again: dict[int, list[int]] = {}
    for fid, want in wanted.items():
        f = files[fid]
        for n in sorted(want):
            if (fid, n) not in have:
                block = store.get((f.key, n))
                if block is None:
                    again.setdefault(fid, []).append(n)
                else:
                    have[fid, n] = block
    if again:
        _fetch_runs(store, files, again, have, [])
    return fetched


def _fetch_runs(
    store: blocks.BlockCache,
    files: dict[int, RemoteFile],
    numbers: dict[int, list[int]],
    have: dict[tuple[int, int], bytes],
    direct: list[tuple[RemoteFile, int, int]],
) -> list[bytes]:
    """Fetches the blocks `numbers` (sorted, by file) in runs, into `have` and the cache,
    with the `direct` ranges in the same concurrent fetch; returns the direct ranges' bytes."""
    bs = blocks.block_bytes()
    runs = [(files[fid], n0, n1) for fid, ns in numbers.items() for n0, n1 in _runs(ns, bs)]
    requests = [(f, n0 * bs, min((n1 + 1) * bs, f.size)) for f, n0, n1 in runs]
    if not requests and not direct:
        return []
    fetched = _fetch(requests + direct)
    for (f, n0, n1), data in zip(runs, fetched):
        for n in range(n0, n1 + 1):
            block = data[(n - n0) * bs : (n - n0 + 1) * bs]
            have[id(f), n] = block
            store.put((f.key, n), block)
    return fetched[len(requests) :]


def _fetch(requests: list[tuple[RemoteFile, int, int]]) -> list[bytes]:
    """Each `(file, start, end)` request's bytes, all in flight at once, with retries."""
    results: list[bytes | None] = [None] * len(requests)
    pending = list(range(len(requests)))
    retries = max_retries()
    attempt = 0
    while pending:
        got = _fetch_once([requests[k] for k in pending])
        failed: list[int] = []
        last: BaseException | None = None
        for k, data in zip(pending, got):
            f, a, b = requests[k]
            if isinstance(data, DataError):
                raise f.explain(data)
            if isinstance(data, BaseException):
                if not is_transient(data):
                    err = failure(f.url, data, f"read it as {f.what}")
                    raise f.explain(err) from data
                failed.append(k)
                last = data
                continue
            if len(data) != b - a:
                raise f.explain(
                    DataError(
                        f"{f.url}: a read of bytes [{a}, {b}) returned {len(data)} bytes; the "
                        f"object is shorter than the {f.size} bytes it had when opened, or "
                        "the store is failing; reopen the source"
                    )
                )
            results[k] = data
        if not failed:
            break
        assert last is not None
        attempt += 1
        urls = sorted({requests[k][0].url for k in failed})
        shown = urls[0] if len(urls) == 1 else f"{urls[0]} (and {len(urls) - 1} more)"
        if attempt > retries:
            raise DataError(
                f"{shown}: cannot read it as {requests[failed[0]][0].what}: {attempt} "
                f"attempts failed, the last with {type(last).__name__}: {last}; the storage "
                "endpoint is unreachable or failing: check the endpoint "
                "(storage_options=), the network and the service, or raise "
                "CHUTE_REMOTE_RETRIES"
            ) from last
        delay = 0.1 * 2 ** (attempt - 1)
        logger.warning(
            "chute: %s: %d range reads failed (%s: %s); retry %d of %d in %.2f s",
            shown,
            len(failed),
            type(last).__name__,
            last,
            attempt,
            retries,
            delay,
        )
        time.sleep(delay)
        pending = failed
    return [r if r is not None else b"" for r in results]  # all set by now


def _fetch_once(requests: list[tuple[RemoteFile, int, int]]) -> list[Any]:
    """One try at every request: bytes, or the exception it raised, for each. Requests
    to objects with a range target go out through `ranges.fetch`; those to one async file
    system in one `cat_ranges` call; the others share threads."""
    from chute._src.remote import ranges

    out: list[Any] = [None] * len(requests)
    by_fs: dict[int, list[int]] = {}
    direct: list[int] = []
    targeted: list[tuple[ranges.Target, int, int]] = []
    for k, (f, a, b) in enumerate(requests):
        if f.target is not None:
            direct.append(k)
            targeted.append((f.target, a, b))
        else:
            by_fs.setdefault(id(f.fs), []).append(k)
    for k, data in zip(direct, ranges.fetch(targeted) if targeted else []):
        out[k] = data
    sync: list[int] = []
    for ks in by_fs.values():
        fs = requests[ks[0]][0].fs
        if not getattr(fs, "async_impl", False):
            sync += ks
            continue
        try:
            got = fs.cat_ranges(
                [requests[k][0]._fspath for k in ks],
                [requests[k][1] for k in ks],
                [requests[k][2] for k in ks],
                on_error="return",
                batch_size=max(1, len(ks)),
            )
        except Exception as e:  # the whole call failed (the loop, the session)
            got = [e] * len(ks)
        for k, data in zip(ks, got):
            out[k] = data

    def one(k: int) -> Any:
        f, a, b = requests[k]
        try:
            return f.fs.cat_file(f._fspath, start=a, end=b)
        except Exception as e:
            return e

    if len(sync) == 1:
        out[sync[0]] = one(sync[0])
    elif sync:
        for k, data in zip(sync, _thread_pool().map(one, sync)):
            out[k] = data
    return out


class RemoteReader(io.RawIOBase):
    """A raw, seekable, read-only file over a `RemoteFile` (for pyarrow, numpy, streams).

    With `ahead` (bytes; 0: off), reads are sequential: once a read ends at `p`, the
    next `ahead` bytes from `p` are fetched in the background (one request on a shared
    thread), so a stream consuming one window finds the next one there, or on the way.
    A read that finds its first bytes in the block cache (the first block, read when
    the object was opened) returns those at once and starts the read-ahead. At most one
    window is held or in flight per reader; a seek elsewhere drops it. Windows pass the
    block cache by: a stream reads its bytes once, and would evict the blocks that
    random reads use."""

    def __init__(self, f: RemoteFile, ahead: int = 0) -> None:
        super().__init__()
        self._f = f
        self._pos = 0
        self.name = f.url
        self._ahead = ahead
        self._held: tuple[int, bytes] | None = None  # (start, bytes) fetched ahead
        self._next: tuple[int, int, Future[bytes]] | None = None  # (start, end, fetch)
        self._pid = os.getpid()  # a fetch in flight belongs to this process's threads

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
        data = self._read_ahead(self._pos, end) if self._ahead else None
        if data is None:
            data = self._f.read_ranges([(self._pos, end)], cache=not self._ahead)[0]
        view[: len(data)] = data
        self._pos += len(data)
        if self._ahead and self._next is None and self._pos < self._f.size:
            a, z = self._pos, min(self._pos + self._ahead, self._f.size)
            if self._held is not None:  # the rest of the held window comes first
                a = self._held[0] + len(self._held[1])
                z = min(a + self._ahead, self._f.size)
            if a < z:
                f, self._pid = self._f, os.getpid()
                fut = _thread_pool().submit(lambda: f.read_ranges([(a, z)], cache=False)[0])
                self._next = (a, z, fut)
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
            fut.cancel()
            self._next = None
        return self._f.cached(pos, end) or None

    def close(self) -> None:
        if self._next is not None:
            self._next[2].cancel()
        self._next, self._held = None, None
        super().close()

    def size(self) -> int:
        return self._f.size
