"""`RemoteFile`: one object of a remote store, read by byte ranges through the block cache.

Opening asks the store for the object's first block and its identity at once: through
obstore (`s3://`, `gs://`, `az://`, `http(s)://`; `stores.py`) one ranged GET, whose
answer carries the size, the ETag, Last-Modified and version, so the block is in the
cache and opening costs one round trip; through fsspec (every other store, or options
obstore cannot express) the file system's `info`. A missing object is a
`MissingFileError`, a directory (a prefix with objects under it) a `DataError` saying so.
`read_ranges` serves a list of byte ranges with as few round trips as it can (`reads.py`:
the blocks the cache lacks, nearby ones merged, all fetched at once). Every answer's
identity is checked against the one the object had when opened: an object replaced or
removed since is named as such (`DataError`), never read through what was learnt of the
old one. An object whose server answers ranged GETs with `200` and the whole object
(`ranges` is False; `fetch.refuses_ranges`) is read whole into the cache for random
access (`reads.py`), and in order from one plain GET by a stream (`body`, `RemoteReader`).

A `RemoteFile` stands in for a mapped local file in chute's readers: slicing it
(`f[a:b]`) returns bytes, `len(f)` is the size, and it has a `FileGuard`'s reading
interface (`leased` is True: a remote object cannot shrink under a mapping, so there is
no size check; `check`, `check_once` and `close` cost nothing). `url` is the URL as
shown in messages: without the password of any credentials in it.
"""

from __future__ import annotations

import functools
import io
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from chute._src.core.errors import DataError, MissingFileError
from chute._src.storage.remote import blocks
from chute._src.storage.remote.calls import call, obstore_failure
from chute._src.storage.remote.reader import RemoteReader
from chute._src.storage.remote.reads import read_many
from chute._src.storage.remote.stores import Located, display_url, located
from chute._src.storage.remote.urls import StorageOptions, filesystem, is_url, options_key

if TYPE_CHECKING:
    from concurrent.futures import Future

    from chute._src.storage.remote import fetch

__all__ = ["RemoteFile", "RemoteReader", "find_objects", "open_concurrently", "read_many"]
T = TypeVar("T")
Identity = tuple[int, str]


def open_concurrently(open_one: Callable[[int], T], paths: Sequence[str]) -> list[T]:
    """`[open_one(k) for k in range(len(paths))]`, run concurrently when several paths are
    URLs (opening one costs a round trip or more); closes what opened when one fails
    (objects with a `close`) and raises the first error."""
    if sum(map(is_url, paths)) < 2:
        return [open_one(k) for k in range(len(paths))]
    from chute._src.storage.remote import pool  # local files need no thread pool (nor its import)

    # No object is read whole while some are opening: whether they all fit is not known
    # until every one is open and counted.
    with blocks.open_objects.opening():
        futures = [pool.submit(functools.partial(open_one, k)) for k in range(len(paths))]
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


def find_objects(
    urls: Sequence[str],
    storage_options: StorageOptions,
    errors: dict[str, BaseException] | None = None,
) -> list[bool]:
    """For each URL, whether it is known to name an object: those obstore reads are asked
    for their first bytes (`first_read_bytes`: up to 1 MiB each, 32 MiB in all), all at
    once (one round trip for the lot, no HEAD), and an object found so is opened already:
    its first bytes go to the block cache (a small object's all of them, kept whole: a
    stream over it then asks for nothing more) and its identity is kept until this
    process opens it (`RemoteFile`), which then costs no request; a read that finds it
    replaced since is a `DataError`. False means not known
    (fsspec's objects, or a failure: the caller asks `fs.info`, which names it); the
    failures obstore met go to `errors` (by URL), so the caller need not ask again."""
    from chute._src.storage.remote import fetch

    found = [False] * len(urls)
    asked: list[tuple[int, Located]] = []
    for k, url in enumerate(urls):
        try:
            loc = located(url, storage_options)
        except Exception:  # bad options: opening names them
            continue
        if loc is not None:
            asked.append((k, loc))
    bs = blocks.block_bytes()
    first = first_read_bytes(min(len(asked), _FIRST_BLOCKS))
    ends = [first if n < _FIRST_BLOCKS else 1 for n in range(len(asked))]
    got = fetch.read_first([(loc, end) for (_, loc), end in zip(asked, ends)])
    opts = options_key(storage_options)
    store = blocks.cache()
    for (k, _), end, answer in zip(asked, ends, got):
        if isinstance(answer, BaseException):
            if errors is not None:
                errors[urls[k]] = answer
            continue
        data, ident, ranges = answer
        found[k] = True
        _keep_found((urls[k], opts), (ident, ranges))
        if end == first and data and len(data) == min(first, ident[0]):
            key = _block_key(urls[k], opts, ident)
            if len(data) == ident[0]:
                store.put((key, blocks.WHOLE), data)  # all of it: kept whole
                continue
            for a in range(0, len(data), bs):
                store.put((key, a // bs), data[a : a + bs])
    return found


def first_read_bytes(objects: int) -> int:
    """How much of each of `objects` found together is read when they are found: a
    share of `_FIRST_BUDGET` (what a round trip of 20 ms carries at ~1.6 GB/s: reading
    it costs about the round trip it saves), between one block and `_FIRST_MAX`, in
    whole blocks. A stream over small objects then finds each one whole in the cache,
    with no request of its own; a large object's first blocks are there too.

    >>> first_read_bytes(1), first_read_bytes(64), first_read_bytes(10_000) == 32 << 10
    (1048576, 524288, True)
    """
    bs = blocks.block_bytes()
    share = _FIRST_BUDGET // max(1, objects)
    return max(bs, min(_FIRST_MAX, share) // bs * bs)


_FIRST_BLOCKS = 256  # objects whose first bytes are read when found (the first to open)
_FIRST_BUDGET = 32 << 20  # bytes read when objects are found, in all...
_FIRST_MAX = 1 << 20  # ...and of each
_FOUND_MAX = 1 << 16  # objects found and not opened yet, kept (oldest dropped first)
# (url, options) -> (identity, answers ranges) of an object found and not opened yet.
_found: OrderedDict[tuple[str, str], tuple[Identity, bool]] = OrderedDict()
_found_lock = threading.Lock()


def _keep_found(key: tuple[str, str], found: tuple[Identity, bool]) -> None:
    with _found_lock:
        _found[key] = found
        _found.move_to_end(key)
        while len(_found) > _FOUND_MAX:
            _found.popitem(last=False)


def _take_found(key: tuple[str, str]) -> tuple[Identity, bool] | None:
    with _found_lock:
        return _found.pop(key, None)


def _block_key(url: str, opts: str, identity: Identity) -> Hashable:
    """What an object's blocks are cached under: blocks are shared by readers of the same
    object (`identity`: size and tags) through the same store options only."""
    return (url, opts, identity)


def fsspec_identity(info: dict[str, Any]) -> Identity:
    """(size, every tag fsspec's `info` reports: ETag, version, mtime, ...).

    >>> fsspec_identity({"size": 3, "ETag": '"ab"', "LastModified": "2026-01-02"})
    (3, 'ETag="ab";LastModified=2026-01-02')
    """
    size = int(info.get("size") or 0)
    tags = []
    for key in ("ETag", "etag", "VersionId", "version_id", "generation", "md5Hash"):
        if info.get(key):
            tags.append(f"{key}={info[key]}")
    for key in ("LastModified", "mtime", "updated", "last_modified", "created"):
        if info.get(key):
            tags.append(f"{key}={info[key]}")
            break
    return size, ";".join(tags)


class RemoteFile:
    """A remote object read by ranges. Raises `DataError` naming `url` when it is
    missing, a directory, unreachable (after bounded retries) or not readable."""

    leased = True  # what FileGuard readers test: no size check is needed
    fd = -1

    def __init__(self, url: str, storage_options: StorageOptions, what: str) -> None:
        self.url = display_url(url)  # what messages show: no password
        self.path = self.url
        self.what = what
        self._url = url
        self._options = storage_options
        self.loc = located(url, storage_options)  # None: read through fsspec
        self.fs: Any = None
        self.fspath = ""  # its path in `fs`
        if self.loc is None:
            self.fs, self.fspath = filesystem(url, storage_options)
        opts = options_key(storage_options)
        first = b""
        self.ranges = True  # False: its server answers ranges with the whole object
        found = _take_found((url, opts)) if self.loc is not None else None
        if found is not None:
            self.identity, self.ranges = found  # its first bytes are in the cache (or were)
        elif self.loc is not None:
            first, self.identity, self.ranges = self._open_obstore(self.loc)
        else:
            self.identity = self._info_identity()
        self.size = self.identity[0]
        self.key = _block_key(url, opts, self.identity)
        if first:
            blocks.cache().put((self.key, 0), first)
        blocks.open_objects.opened(self.key, self.size)  # counted until closed or collected
        self._opened = weakref.finalize(self, blocks.open_objects.closed, self.key)

    def _open_obstore(self, loc: Located) -> tuple[bytes, Identity, bool]:
        """The first block, identity and whether the server answers ranges, from one
        ranged GET (a plain one if it does not; a HEAD for a 0-byte object); a missing
        object or a directory named as such."""
        from chute._src.storage.remote import fetch

        got = fetch.read_first([(loc, blocks.block_bytes())])[0]
        if not isinstance(got, BaseException):
            data, ident, ranges = got
            full = len(data) == min(blocks.block_bytes(), ident[0])
            return (data if full else b""), ident, ranges
        err = obstore_failure(self.url, got, f"open it as {self.what}")
        if isinstance(err, MissingFileError) and loc.kind != "http":
            try:
                inside = fetch.list_prefix(loc, limit=1)
            except Exception:
                inside = []
            if inside:
                raise self._directory_error() from None
        raise err from got

    def _directory_error(self) -> DataError:
        return DataError(
            f"{self.url}: it is a directory, not an object: cannot read it as "
            f"{self.what}; name the object(s) inside it, or a glob pattern"
        )

    def _info_identity(self) -> Identity:
        """(size, identity) from the file system's `info` (a HEAD for s3); `DataError`
        for a missing object or a directory."""
        info = call(self.url, f"open it as {self.what}", lambda: self.fs.info(self.fspath))
        if info.get("type") == "directory":
            raise self._directory_error()
        return fsspec_identity(info)

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

    def current_identity(self) -> Identity:
        """The object's identity now (a HEAD, or fsspec's `info`); `MissingFileError` if
        it is gone."""
        from chute._src.storage.remote import fetch

        if self.loc is not None:
            loc = self.loc
            try:
                return fetch.head(loc)
            except Exception as e:
                raise obstore_failure(self.url, e, "check it") from e
        self.fs.invalidate_cache(self.fspath)
        return fsspec_identity(call(self.url, "check it", lambda: self.fs.info(self.fspath)))

    def changed_error(self) -> DataError | None:
        """A DataError if the object is gone or differs from when it was opened, else None."""
        from chute._src.storage.remote import fetch

        try:
            now = self.current_identity()
        except MissingFileError:
            return DataError(
                f"{self.url}: the object was removed after chute opened it as {self.what}; "
                "a dataset must stay in place while it is read: restore it and reopen the "
                "source"
            )
        except DataError:
            return None  # the store cannot tell: the read's own error stands
        if fetch.same(self.identity, now):
            return None
        return self.changed(now)

    def changed(self, now: Identity) -> DataError:
        return DataError(
            f"{self.url}: the object changed after chute opened and indexed it (size and "
            f"tags then {self.identity}, now {now}); a dataset must not be rewritten in "
            "place while it is read: write new objects under new names, then reopen the "
            "source"
        )

    def copy_to(self, local: str) -> None:
        """Writes the object, as it was opened, to the local file `local` (in windows of
        16 MiB, each checked as every read is; in order from one plain GET if its server
        refuses ranges)."""
        step = 16 << 20
        with open(local, "wb") as out:
            if self.loc is not None and not self.ranges:
                body = self.body(step)
                try:
                    while chunk := self.read_body(body, step):
                        out.write(chunk)
                finally:
                    body.close()
                return
            for a in range(0, self.size, step):
                out.write(self.read_ranges([(a, min(a + step, self.size))], cache=False)[0])

    def body(self, chunk: int = 1 << 20) -> fetch.Body:
        """The object's bytes in order from one plain GET (`read_body` reads them)."""
        from chute._src.storage.remote import fetch

        assert self.loc is not None
        return fetch.Body(self.loc, self.identity, chunk)

    def read_body(self, body: fetch.Body, n: int) -> bytes:
        """The next `n` bytes of `body`; a `DataError` naming the object if it changed or
        the server failed."""
        from chute._src.storage.remote import fetch
        from chute._src.storage.remote.loop import Exiting

        try:
            return body.read(n)
        except fetch.Changed as e:
            raise self.changed(e.now) from None
        except Exiting:
            raise
        except Exception as e:
            raise self.explain(obstore_failure(self.url, e, f"read it as {self.what}")) from e

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

    def read_later(self, start: int, end: int) -> Future[bytes]:
        """The bytes of `[start, end)`, fetched exactly in the background (a stream's next
        window) on a daemon thread: an abandoned one never holds up the process's exit."""
        from chute._src.storage.remote import pool

        return pool.submit(lambda: self.read_ranges([(start, end)], cache=False)[0])

    def reader(self, buffer_size: int = 1 << 20, *, sequential: bool = False) -> io.BufferedReader:
        """A seekable binary file object over the object (reads go through `read_ranges`);
        `sequential`: each window of `buffer_size` bytes read ahead of the reads."""
        raw = RemoteReader(self, ahead=buffer_size if sequential else 0)
        return io.BufferedReader(raw, buffer_size=buffer_size)

    def cached(self, start: int, end: int) -> bytes:
        """The bytes from `start` (up to `end`) that the block cache holds, without a
        request: the object's, when it is kept whole, else those of the blocks there in a
        row from `start`'s, maybe none."""
        bs = blocks.block_bytes()
        store = blocks.cache()
        whole = store.get((self.key, blocks.WHOLE))
        if whole is not None:
            return whole[start:end]
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
