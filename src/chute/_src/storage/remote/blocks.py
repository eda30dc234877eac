"""A process-wide LRU cache of fixed-size blocks of remote objects, bounded in bytes.

Blocks are keyed by the object's URL, its identity (size and tags: ETag, Last-Modified,
version) and the block number, so a replaced object never serves stale blocks. Sizes come from the
environment, which worker processes inherit: `CHUTE_REMOTE_BLOCK_BYTES` (default 32 KiB:
a random read of a small record fetches little more than the record, and neighbours come
with it) and `CHUTE_REMOTE_CACHE_BYTES` (default: an eighth of the memory available when
first used, shared by a pipeline's worker processes, at least 128 MiB; 0 turns caching
off), as the page cache keeps a local file's pages in memory.

The remote objects open in this process are counted (`open_objects`): while they fit in
the cache together (`BlockCache.holds_all`), a read that misses fetches its whole object,
kept whole (as block number `WHOLE`), so random reads of a dataset that fits in memory
cost a round trip per object, once, then a slice each. The cache also knows the blocks
being fetched (`claim`, `release`): threads reading at once fetch each block once, a
thread needing a block another one is fetching waiting for it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterator

from chute._src import process_effects

__all__ = [
    "WHOLE",
    "BlockCache",
    "OpenObjects",
    "block_bytes",
    "cache",
    "default_cache_bytes",
    "open_objects",
]

_DEFAULT_BLOCK = 32 << 10
_MIN_DEFAULT_CACHE = 128 << 20
_MEMORY_SHARE = 8  # the default cache is 1/8 of the available memory, divided among workers
WHOLE = -1
"""The block number under which an object kept whole is cached."""
WHOLE_SHARE = 0.75
"""Objects are read whole while all those open fit in this share of the cache (the rest
is room for blocks of objects opened later)."""


def _env_bytes(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; set it to a number of bytes") from None
    if n < minimum:
        raise ValueError(f"{name}={n} is below {minimum}; set it to {minimum} bytes or more")
    return n


def block_bytes() -> int:
    """`CHUTE_REMOTE_BLOCK_BYTES`: the size of a cached block (at least 512)."""
    return _env_bytes("CHUTE_REMOTE_BLOCK_BYTES", _DEFAULT_BLOCK, 512)


def default_cache_bytes() -> int:
    """The cache size when `CHUTE_REMOTE_CACHE_BYTES` is not set: an eighth of the
    available memory (`MemAvailable`, within a cgroup's limit), divided among the worker
    processes of the pipeline this process works for, and at least 128 MiB."""
    from chute._src.core.machine import available_memory
    from chute._src.core.process import worker_count

    return max(_MIN_DEFAULT_CACHE, available_memory() // _MEMORY_SHARE // worker_count())


class BlockCache:
    """Blocks by key, least recently used evicted first once over `max_bytes`. Thread-safe.

    >>> c = BlockCache(max_bytes=8)
    >>> c.put("a", b"1234"); c.put("b", b"5678"); c.put("c", b"9")
    >>> c.get("a"), c.get("b"), c.nbytes
    (None, b'5678', 5)

    Blocks being fetched: the first to claim a block fetches it; the others wait.

    >>> mine, theirs = c.claim(["p", "q"])
    >>> mine, c.claim(["q", "r"])[0]
    (['p', 'q'], ['r'])
    >>> c.release(["p", "q", "r"])
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._blocks: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()
        self._fetching: dict[Hashable, threading.Event] = {}

    def __contains__(self, key: Hashable) -> bool:
        return key in self._blocks  # no lock: a dict lookup is atomic; LRU order kept

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
            return block

    def get_many(self, keys: list[Hashable]) -> list[bytes] | None:
        """The blocks of `keys`, in order, under one lock; None if any is missing."""
        out: list[bytes] = []
        append = out.append
        with self._lock:
            get, move = self._blocks.get, self._blocks.move_to_end
            for key in keys:
                block = get(key)
                if block is None:
                    return None
                move(key)
                append(block)
        return out

    def put(self, key: Hashable, block: bytes) -> None:
        if len(block) > self.max_bytes:
            return
        with self._lock:
            old = self._blocks.pop(key, None)
            if old is not None:
                self.nbytes -= len(old)
            self._blocks[key] = block
            self.nbytes += len(block)
            while self.nbytes > self.max_bytes:
                _, dropped = self._blocks.popitem(last=False)
                self.nbytes -= len(dropped)

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()
            self.nbytes = 0

    def holds_all(self) -> bool:
        """Whether the objects open fit in the cache together (in `WHOLE_SHARE` of it):
        then a read that misses fetches its whole object."""
        objects = open_objects
        return not objects.openings and 0 < objects.nbytes <= self.max_bytes * WHOLE_SHARE

    # -- blocks being fetched --------------------------------------------------------------
    def claim(self, keys: list[Hashable]) -> tuple[list[Hashable], list[threading.Event]]:
        """Of `keys` (blocks the caller lacks): those the caller is to fetch, now marked
        as being fetched (it must `release` them, fetched or not), and the events of
        those another thread is fetching, set when it releases them."""
        mine: list[Hashable] = []
        theirs: dict[int, threading.Event] = {}
        ours = threading.Event()  # one for all the keys this call claims
        with self._lock:
            for key in keys:
                event = self._fetching.get(key)
                if event is not None:
                    theirs[id(event)] = event
                elif key not in self._blocks:
                    self._fetching[key] = ours
                    mine.append(key)
        return mine, list(theirs.values())

    def release(self, keys: list[Hashable]) -> None:
        """The blocks `claim`ed are in the cache now, or failed: those waiting go on."""
        with self._lock:
            events = {id(e): e for e in (self._fetching.pop(k, None) for k in keys) if e}
        for event in events.values():
            event.set()

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._fetching = {}  # the threads fetching them are not in this process


class OpenObjects:
    """The remote objects open in this process, by key (an object opened by several
    readers counts once), and their bytes together. Thread-safe."""

    def __init__(self) -> None:
        self.nbytes = 0
        self.openings = 0  # sets of objects being opened together (not all counted yet)
        self._open: dict[Hashable, list[int]] = {}  # key -> [size, readers]
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def opening(self) -> Iterator[None]:
        """While objects are opened together: until all are counted, whether they fit
        is not known."""
        _register_hooks()
        with self._lock:
            self.openings += 1
        try:
            yield
        finally:
            with self._lock:
                self.openings -= 1

    def opened(self, key: Hashable, size: int) -> None:
        """A reader of the object `key` (of `size` bytes) was opened."""
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                self._open[key] = [size, 1]
                self.nbytes += size
            else:
                entry[1] += 1

    def closed(self, key: Hashable) -> None:
        """A reader `opened` was closed (or collected)."""
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del self._open[key]
                self.nbytes -= entry[0]

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self.openings = 0  # the threads opening them are not in this process


open_objects = OpenObjects()
_cache: BlockCache | None = None


def cache() -> BlockCache:
    """This process's block cache (sized by `CHUTE_REMOTE_CACHE_BYTES`, or
    `default_cache_bytes()`, when first used)."""
    global _cache
    if _cache is None:
        _register_hooks()
        _cache = BlockCache(_env_bytes("CHUTE_REMOTE_CACHE_BYTES", default_cache_bytes(), 0))
    return _cache


def _register_hooks() -> None:
    process_effects.register_once("remote-blocks", after_in_child=_after_fork_in_child)


def _after_fork_in_child() -> None:
    open_objects._after_fork()
    if _cache is not None:
        _cache._after_fork()
