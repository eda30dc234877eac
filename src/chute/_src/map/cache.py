"""`MapDataset.cache()`: elements kept in memory by the dataset, for every iterator, epoch
and (where the platform has shared memory) worker process.

The cache belongs to the dataset, not to an iterator: `for epoch in range(2): for x in
ds: ...` computes each element once. It is keyed by position in the epoch, as tf.data's
`cache()`: index `i` reads position `i % len(ds)` of the parent, in every epoch, so what
is below the cache is computed for epoch 0's positions only (put `shuffle` and
`random_map` after the cache; below it they would give every epoch epoch 0's draws).
Because of that rule the output never depends on what the cache holds.

It is bounded by `max_elements` and/or `max_bytes` (default: a quarter of the available
memory): the elements computed first are kept until the bound is reached; the others are
computed again each time they are read (nothing is evicted: a cyclic reader would evict
every element just before reading it again). Its numpy arrays are handed out as read-only views, since
they are handed out again: a stage changing one in place raises instead of changing the
cache.

Under `mp_prefetch` the workers share one store in a shared-memory file (`/dev/shm`,
`_src/map/shared_cache.py`), owned by the dataset and kept across its iterators: an
element computed by any worker is read by every other, in later epochs and iterators.
What the main process had cached by itself is copied in when the store is made.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Protocol, TypeVar

import numpy as np

from chute._src import tree
from chute._src.autotune import memory_budget
from chute._src.dataset import INFINITE, MapDataset

T = TypeVar("T")

MISSING: Any = object()
"""What a store's `get` returns for a position it does not keep."""


def element_bytes(element: Any) -> int:
    """The memory an element holds: its arrays' bytes, other leaves' own size."""
    total = 0
    for leaf in tree.leaves(element):
        total += leaf.nbytes if isinstance(leaf, np.ndarray) else sys.getsizeof(leaf)
    return total


def _read_only(leaf: Any) -> Any:
    if not isinstance(leaf, np.ndarray):
        return leaf
    view = leaf.view()
    view.flags.writeable = False
    return view


def freeze(element: Any) -> Any:
    """`element` with read-only views of its numpy arrays (they are shared from now on;
    the arrays themselves, which may be the user's, are left as they are)."""
    return tree.map_leaves(_read_only, element)


class Store(Protocol):
    """Where a cache keeps elements by position."""

    def get(self, position: int) -> Any:
        """The element kept at `position`, or `MISSING`."""

    def put(self, position: int, element: Any) -> None:
        """Keeps `element` if the bound allows; otherwise does nothing."""

    def stats(self) -> tuple[int, int]:
        """(elements kept, bytes kept)."""


class MemoryStore:
    """A dict in this process, up to `max_elements` and `max_bytes`."""

    def __init__(self, max_elements: int | None, max_bytes: int) -> None:
        self.max_elements, self.max_bytes = max_elements, max_bytes
        self._items: dict[int, Any] = {}
        self._bytes = 0
        self._full = False
        self._lock = threading.Lock()

    def get(self, position: int) -> Any:
        return self._items.get(position, MISSING)

    def put(self, position: int, element: Any) -> None:
        if self._full:
            return
        size = element_bytes(element)
        with self._lock:
            if position in self._items:
                return
            if self._bytes + size > self.max_bytes or (
                self.max_elements is not None and len(self._items) >= self.max_elements
            ):
                # Kept elements stay; a smaller element may still fit under max_bytes.
                self._full = self.max_elements is not None and len(self._items) >= self.max_elements
                return
            self._items[position] = element
            self._bytes += size

    def stats(self) -> tuple[int, int]:
        return len(self._items), self._bytes

    def items(self) -> list[tuple[int, Any]]:
        with self._lock:
            return list(self._items.items())

    def __getstate__(self) -> dict[str, Any]:  # a copy sent elsewhere starts empty
        return {"max_elements": self.max_elements, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["max_elements"], state["max_bytes"])  # type: ignore[misc]


class _Box:
    """The store of a cache, shared by the copies of its node; pickles as its store (a
    `MemoryStore` arrives empty, a `SharedStore` as its file)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["store"])  # type: ignore[misc]


def _bound(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(
            f"MapDataset.cache: {name}={value!r} is invalid: it must be an int >= 0 (0 keeps "
            "nothing), e.g. max_bytes=2 << 30 or max_elements=100_000, or None."
        )
    return int(value)


class CacheMapDataset(MapDataset[T]):
    """Keeps its parent's elements in memory, shared by every iterator and epoch.

    >>> import chute
    >>> calls = []
    >>> ds = chute.MapDataset.range(4).map(lambda x: calls.append(x) or x * 10).cache()
    >>> [list(ds) for epoch in range(2)], len(calls)
    ([[0, 10, 20, 30], [0, 10, 20, 30]], 4)
    >>> small = chute.MapDataset.range(4).map(lambda x: calls.append(x) or x).cache(max_elements=1)
    >>> calls.clear(); _ = [list(small) for epoch in range(2)]; len(calls)
    7
    """

    def __init__(
        self,
        parent: MapDataset[T],
        *,
        max_elements: int | None = None,
        max_bytes: int | None = None,
    ) -> None:
        super().__init__([parent])
        elements = _bound(max_elements, "max_elements")
        limit = _bound(max_bytes, "max_bytes")
        self._max_elements = elements
        self._max_bytes = memory_budget() if limit is None else limit
        self._len = len(parent)
        # Shared by the copies of this node (rewrites for workers or timing: `with_parents`).
        self._box = _Box(MemoryStore(elements, self._max_bytes))

    def __len__(self) -> int:
        return self._len

    @property
    def held(self) -> tuple[int, int]:
        """(elements, bytes) the cache holds now (in this process, or in the shared store
        its workers use)."""
        return self._box.store.stats()

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        n = self._len
        positions = indices % n if 0 < n < INFINITE else indices
        keys = positions.tolist()
        store = self._box.store
        out = [store.get(p) for p in keys]
        missing = [j for j, x in enumerate(out) if x is MISSING]
        if missing:
            wanted = np.asarray([keys[j] for j in missing], dtype=np.int64)
            for j, x in zip(missing, self._parents[0]._getitems(wanted)):
                x = freeze(x)
                store.put(keys[j], x)
                out[j] = x
        return out

    def for_workers(self, resources: list[Any]) -> CacheMapDataset[T]:
        """This cache with a store in shared memory that every worker reads and fills;
        made once, kept while the dataset lives (so later iterators find it filled)."""
        from chute._src.map.shared_cache import SharedStore, shared_memory_available

        if not shared_memory_available() or not 0 < self._len < INFINITE:
            return self
        box = self._box
        with box.lock:
            if isinstance(box.store, MemoryStore):
                store = SharedStore(self._len, self._max_elements, self._max_bytes)
                for position, element in box.store.items():
                    store.put(position, element)
                box.store = store  # this process reads and fills it too from now on
        return self

    def cache_identity(self) -> dict[str, Any]:
        return {}  # the bounds and the store never change the elements

    def __repr__(self) -> str:
        return f"CacheMapDataset(max_elements={self._max_elements}, max_bytes={self._max_bytes})"
