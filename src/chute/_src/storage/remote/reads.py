"""Reads of byte ranges across remote objects through the block cache (`read_many`).

The blocks a batch of ranges needs that the cache lacks are grouped into runs (adjacent
or nearby blocks become one request), and every run is fetched at once: through obstore
for the objects it reads (`fetch.read_ranges`: one hand-off to its runtime, each answer
checked against the object's identity), through fsspec's async `cat_ranges` for an async
file system, else on the pool's threads. While every object open fits in the cache, a
miss fetches its whole object instead (in requests of up to 16 MiB, all at once).

An object whose server refuses ranges (it answers a ranged GET with `200` and the whole
object; `RemoteFile.ranges` is False) is fetched whole, by one plain GET, and kept whole
in the cache: every read of it is a slice. It must fit in the share of the cache kept for
whole objects (`whole_cap`), else the read is a `DataError` naming the object, its size,
the cap and the fixes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, cast

from chute._src.core.errors import DataError
from chute._src.storage.remote import blocks
from chute._src.storage.remote.calls import failure, obstore_failure

if TYPE_CHECKING:
    from chute._src.storage.remote.file import RemoteFile

__all__ = ["read_many"]

_GAP_BLOCKS = 2  # missing blocks this close together are fetched in one request
_MAX_RUN = 16 << 20  # the longest request a run grows to


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
        rangeless = [(f, a, b) for f, a, b in items if not f.ranges]
        if rangeless or store.holds_all():
            _fetch_whole(store, items if store.holds_all() else rangeless)
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
        parts = [(f, a, min(a + _part(f), f.size)) for f in todo for a in _starts(f)]
        fetched = iter(_fetch(parts)) if parts else iter(())
        for f in todo:
            pieces = [next(fetched) for _ in _starts(f)]
            store.put((f.key, blocks.WHOLE), pieces[0] if len(pieces) == 1 else b"".join(pieces))
    finally:
        store.release(mine)
    for event in waits:
        event.wait()


def _part(f: RemoteFile) -> int:
    """The longest request for a whole object: `_MAX_RUN`, or all of it (one plain GET)
    when its server refuses ranges."""
    return _MAX_RUN if f.ranges else max(1, f.size)


def _starts(f: RemoteFile) -> range:
    return range(0, f.size, _part(f))


def whole_cap() -> int:
    """The most bytes an object kept whole in the cache may have: `WHOLE_SHARE` of it."""
    return int(blocks.cache().max_bytes * blocks.WHOLE_SHARE)


def _too_large(f: RemoteFile, cap: int) -> DataError:
    need = -(-f.size * 4 // 3)  # the cache size whose WHOLE_SHARE holds it
    return DataError(
        f"{f.url}: cannot read it as {f.what}: its server answers range requests without "
        "the range (not with a 206, as a server without Range support does), so chute "
        f"reads such an object whole, once, and keeps it in the block cache; at "
        f"{f.size:,} bytes it is larger than the {cap:,} bytes the cache keeps whole (three "
        f"quarters of CHUTE_REMOTE_CACHE_BYTES={blocks.cache().max_bytes:,}): serve the "
        "files from a server that supports Range requests, read them as a stream "
        "(chute.experimental.JsonlIterDataset, FileLinesIterDataset), or set "
        f"CHUTE_REMOTE_CACHE_BYTES={need} or more"
    )


def _from_wholes(requests: list[tuple[RemoteFile, int, int]]) -> list[Any]:
    """Each `(file, start, end)` of objects whose servers refuse ranges: a slice of the
    whole object, from the cache or fetched (one plain GET each, all at once) and kept
    there; the exception a fetch ended with for its requests."""
    from chute._src.storage.remote import fetch

    store = blocks.cache()
    cap = whole_cap()
    wholes: dict[RemoteFile, Any] = {}
    for f, _, _ in requests:
        if f not in wholes:
            wholes[f] = store.get((f.key, blocks.WHOLE))
    missing = [f for f, data in wholes.items() if data is None]
    for f in missing:
        if f.size > cap:
            raise _too_large(f, cap)
    got = fetch.read_whole([(f.loc, f.identity) for f in missing if f.loc is not None])
    for f, data in zip(missing, got):
        wholes[f] = data
        if not isinstance(data, BaseException):
            store.put((f.key, blocks.WHOLE), data)
    out: list[Any] = []
    for f, a, b in requests:
        data = wholes[f]
        out.append(data if isinstance(data, BaseException) else data[a:b])
    return out


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
    """Each `(file, start, end)` request's bytes, all in flight at once. The clients retry
    their own requests (`calls.py`); a range a server refused is asked again, of the whole
    object."""
    from chute._src.storage.remote import fetch

    results: list[bytes | None] = [None] * len(requests)
    pending = list(range(len(requests)))
    while pending:
        got = _fetch_once([requests[k] for k in pending])
        refused: list[int] = []  # ranges refused: asked again, of the whole object
        for k, data in zip(pending, got):
            f, a, b = requests[k]
            if f.ranges and isinstance(data, BaseException) and fetch.refuses_ranges(data):
                f.ranges = False  # the server stopped answering ranges since it was opened
                refused.append(k)
                continue
            if isinstance(data, fetch.Changed):
                raise f.changed(data.now)
            if isinstance(data, DataError):
                raise f.explain(data)
            if isinstance(data, BaseException):
                if f.loc is None:
                    raise f.explain(failure(f.url, data, f"read it as {f.what}")) from data
                err = obstore_failure(f.url, data, f"read it as {f.what}")
                if isinstance(data, TimeoutError):
                    raise err from data  # a silent server: asking it again waits too
                raise f.explain(err) from data
            if len(data) != b - a:
                raise f.explain(
                    DataError(
                        f"{f.url}: a read of bytes [{a}, {b}) returned {len(data)} bytes; the "
                        f"object is shorter than the {f.size} bytes it had when opened, or "
                        "the store is failing; reopen the source"
                    )
                )
            results[k] = data
        pending = refused
    return [r if r is not None else b"" for r in results]  # all set by now


def _fetch_once(requests: list[tuple[RemoteFile, int, int]]) -> list[Any]:
    """One try at every request: bytes, or the exception it ended with, for each.
    Requests to obstore's objects go out in one `fetch.read_ranges`; those to one async
    file system in one `cat_ranges` call; the others share the pool's threads."""
    from chute._src.storage.remote import fetch, pool

    out: list[Any] = [None] * len(requests)
    by_fs: dict[int, list[int]] = {}
    direct: list[int] = []
    whole: list[int] = []  # of objects whose servers refuse ranges
    for k, (f, _, _) in enumerate(requests):
        if f.loc is None:
            by_fs.setdefault(id(f.fs), []).append(k)
        elif f.ranges:
            direct.append(k)
        else:
            whole.append(k)
    if whole:
        for k, data in zip(whole, _from_wholes([requests[k] for k in whole])):
            out[k] = data
    asked = []
    for k in direct:
        f, a, b = requests[k]
        assert f.loc is not None
        asked.append((f.loc, a, b, f.identity))
    for k, data in zip(direct, fetch.read_ranges(asked)):
        out[k] = data
    sync: list[int] = []
    for ks in by_fs.values():
        fs = requests[ks[0]][0].fs
        if not getattr(fs, "async_impl", False):
            sync += ks
            continue
        try:
            got = fs.cat_ranges(
                [requests[k][0].fspath for k in ks],
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
            return f.fs.cat_file(f.fspath, start=a, end=b)
        except Exception as e:
            return e

    if len(sync) == 1:
        out[sync[0]] = one(sync[0])
    elif sync:
        futures = [(k, pool.submit(functools.partial(one, k))) for k in sync]
        for k, fut in futures:
            out[k] = fut.result()
    return out
