"""A process-wide LRU cache of fixed-size blocks of remote objects, bounded in bytes.

Blocks are keyed by the object's URL, its identity (size and ETag, version or mtime) and
the block number, so a replaced object never serves stale blocks. Sizes come from the
environment, which worker processes inherit: `CHUTE_REMOTE_BLOCK_BYTES` (default 32 KiB:
a random read of a small record fetches little more than the record, and neighbours come
with it) and `CHUTE_REMOTE_CACHE_BYTES` (default 128 MiB per process; 0 turns caching off).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["BlockCache", "block_bytes", "cache"]

_DEFAULT_BLOCK = 32 << 10
_DEFAULT_CACHE = 128 << 20


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


class BlockCache:
    """Blocks by key, least recently used evicted first once over `max_bytes`. Thread-safe.

    >>> c = BlockCache(max_bytes=8)
    >>> c.put("a", b"1234"); c.put("b", b"5678"); c.put("c", b"9")
    >>> c.get("a"), c.get("b"), c.nbytes
    (None, b'5678', 5)
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._blocks: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> bytes | None:
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._blocks.move_to_end(key)
            return block

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

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


_cache: BlockCache | None = None


def cache() -> BlockCache:
    """This process's block cache (sized by `CHUTE_REMOTE_CACHE_BYTES` when first used)."""
    global _cache
    if _cache is None:
        _cache = BlockCache(_env_bytes("CHUTE_REMOTE_CACHE_BYTES", _DEFAULT_CACHE, 0))
    return _cache


def _after_fork_in_child() -> None:
    if _cache is not None:
        _cache._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
