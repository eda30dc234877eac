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
`_src/ops/cache_stores.py`), owned by the dataset and kept across its iterators: an
element computed by any worker is read by every other, in later epochs and iterators.
What the main process had cached by itself is copied in when the store is made.

`experimental.CacheIterDataset` / `IterDataset.cache()`: later passes from memory.

The iterator keeps the elements of its first pass over the parent; a pass that starts
again from the beginning (a `repeat` after the cache restores it to its start) is served
from memory without touching the parent: the parent is not even restored (that would
start its read-ahead again, an interleave's or a prefetch's threads reading the source
for nothing), and the state reports the parent's state the rewind gave. The cache
lives in the iterator, never in its state: a fresh iterator restored mid-pass continues
from the parent's state, and reads the pass whole again from the parent's start when the
next pass begins; restored into a pass served from memory, it reads the pass whole at
once. Either way later passes come from memory, and the parent stands at its end during
them, as in the run that kept the first pass (a weight change made then reaches a
mixture below where it reached it there).
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import numpy as np

from chute._src.core import provenance, tree
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator, bad_value, check_int, check_state
from chute._src.core.machine import memory_budget
from chute._src.ops.cache_stores import MISSING, MemoryStore, Store

T = TypeVar("T")


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


class _Box:
    """The store of a cache, shared by the copies of its node; pickles as its store (a
    `MemoryStore` arrives empty; a `SharedStore` as its file where its descriptor was
    handed over, an empty `MemoryStore` elsewhere: `cache_stores.py`)."""

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

    _keeps_element_spec = True  # its elements are its first parent's

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
            # Each position once, however often the block reads it (a block that spans
            # epochs reads a position once in each).
            slots: dict[int, list[int]] = {}
            for j in missing:
                slots.setdefault(keys[j], []).append(j)
            wanted = np.fromiter(slots, dtype=np.int64, count=len(slots))
            for (position, js), x in zip(slots.items(), self._parents[0]._getitems(wanted)):
                x = freeze(x)
                store.put(position, x)
                for j in js:
                    out[j] = x
        return out

    def _for_workers(self, resources: list[Any]) -> CacheMapDataset[T]:
        """This cache with a store in shared memory that every worker reads and fills;
        made once, kept while the dataset lives (so later iterators find it filled)."""
        from chute._src.ops.cache_stores import SharedStore, shared_memory_available

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

    def _cache_identity(self) -> dict[str, Any]:
        return {}  # the bounds and the store never change the elements

    def __repr__(self) -> str:
        return f"CacheMapDataset(max_elements={self._max_elements}, max_bytes={self._max_bytes})"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's element at `position % len`, as `_getitems` reads it: every epoch
        of the cache is its parent's epoch 0, so the pass (`position // len`) is added to
        the records' epoch here, not read from the parent's positions past its end (which
        a parent that is no epoch-wise index space, a mixture whose weights are a function
        of the step, reads as other elements)."""
        n = self._len
        if not 0 < n < INFINITE:
            return provenance.same_position(position)
        epoch, pos = divmod(position, n)
        return [provenance.Origin(0, pos, fields=(("epoch", epoch),) if epoch else ())]


class CacheIterDataset(IterDataset[T]):
    """Caches the stream in memory; repeating it replays the cache.

    >>> import chute
    >>> calls = []
    >>> ds = chute.MapDataset.range(3).to_iter_dataset().map(lambda x: calls.append(x) or x)
    >>> list(ds.cache().repeat(3)), len(calls)
    ([0, 1, 2, 0, 1, 2, 0, 1, 2], 3)
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, parent: IterDataset[T]) -> None:
        super().__init__([parent])

    def _make_iterator(self) -> DatasetIterator[T]:
        return _MemoryCacheIterator(self._parent_iter())

    def __repr__(self) -> str:
        return "CacheIterDataset()"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        return provenance.same_position(position)  # the same elements, kept


class _MemoryCacheIterator(DatasetIterator[T]):
    stage = "cache"

    def __init__(self, parent: DatasetIterator[T]) -> None:
        super().__init__(parent)
        self._start = parent.get_state()
        self._cache: list[T] = []
        self._filled = False
        self._pos = 0
        self._met_end = False  # the parent has ended a pass (with a gap or not)
        # The parent's state when its pass ended (the cache filled).
        self._parent_end: Any = None
        # While a pass is served from memory after a rewind to a state of this run (a
        # `repeat`, a restore): the parent's state as this stage's state reports it. The
        # parent itself stays where its pass ended, never read.
        self._parent_at: Any = None

    def __next__(self) -> T:
        pos = self._pos
        if self._filled and pos < len(self._cache):
            self._pos = pos + 1
            return self._cache[pos]
        if self._filled:
            raise StopIteration
        try:
            x = next(self._parent)
        except StopIteration:
            self._met_end = True
            self._filled = pos == len(self._cache)
            if self._filled:
                self._parent_end = self._parent.get_state()
            raise
        if pos == len(self._cache):
            self._cache.append(x)
        self._pos = pos + 1
        return x

    def _next_many(self, n: int) -> list[T]:
        if self._filled:
            cached = self._cache[self._pos : self._pos + n]
            self._pos += len(cached)
            return cached
        out: list[T] = []
        try:
            for _ in range(n):
                out.append(self.__next__())
        except StopIteration:
            pass
        return out

    def get_state(self) -> dict[str, Any]:
        parent = self._parent_at if self._parent_at is not None else self._parent.get_state()
        return {
            "stage": self.stage,
            "position": self._pos,
            "filled": int(self._filled),
            "parent": parent,
        }

    def _rewinds_in_memory(self, state: dict[str, Any], filled: int, pos: int) -> bool:
        """Whether restoring `state` into this filled iterator needs nothing of the parent:
        the state is this run's own, at the start of the pass (what `repeat` rewinds to) or
        served from memory, its parent's state one the parent handed out here (the pass's
        start or end, brought up to date: `_catch_up`). Another parent state is restored
        into the parent, which checks it."""
        if not self._filled or (not filled and pos != 0):
            return False
        parent = state["parent"]
        known = [self._start] if not filled else [self._start, self._parent_end]
        return any(parent == self._parent._catch_up(k) for k in known if k is not None)

    def _restore(self, state: Any, path: str) -> None:
        check_state(state, self.stage, {"stage", "position", "filled", "parent"}, path)
        pos = check_int(state, "position", path)
        filled = check_int(state, "filled", path, 0, 1, "1 while the pass is served from memory")
        if self._rewinds_in_memory(state, filled, pos):
            self._check_cached(pos, path)
            self._parent_at, self._pos = state["parent"], pos
            return
        self._parent_at = None
        later_pass = not filled and pos == 0 and self._met_end and not self._filled
        if not filled and not later_pass:
            # The parent continues from there; the cache grows again once a pass from the
            # start reaches its end (a restored pass with a gap does not fill it).
            self._parent._restore(state["parent"], f"{path}['parent']")
            check_pass_position(self, state, self._start, pos, path)
            self._pos = pos
            return
        # Served from memory. The parent's state is still checked, and brings the history
        # it records (a mixture's weight changes) into the parent.
        self._parent._restore(state["parent"], f"{path}['parent']")
        if not self._filled:
            # A pass this iterator does not hold (restored after the first pass began, or
            # into a replay): read whole now, so the parent ends where it ended in the run
            # that kept the first pass, before anything is changed during this pass.
            self._read_pass(path)
            self._parent_at = state["parent"]
        self._check_cached(pos, path)
        self._pos = pos

    def _check_cached(self, pos: int, path: str) -> None:
        """A position served from memory lies within the pass cached."""
        if pos > len(self._cache):
            raise bad_value(
                path, "position", pos, f"the stream cached has {len(self._cache)} elements"
            )

    def _read_pass(self, path: str) -> None:
        """Reads the whole pass from the parent's start into memory."""
        self._parent._restore(self._parent._catch_up(self._start), f"{path}['parent']")
        self._cache, self._filled, self._pos = [], False, 0
        while not self._filled:
            try:
                self.__next__()
            except StopIteration:
                self._filled = True
                self._parent_end = self._parent.get_state()


def check_pass_position(
    it: DatasetIterator[Any], state: dict[str, Any], start: Any, pos: int, path: str
) -> None:
    """`pos`, the elements handed out in a pass from the parent, against the parent's
    position in `state` (when the parent knows it) minus its position at `start`."""
    count, begin = it._parent._count_at(state["parent"]), it._parent._count_at(start)
    if count is not None and begin is not None and pos != count - begin:
        raise bad_value(
            path,
            "position",
            pos,
            f"it counts the elements of this pass, and the parent's state {path}['parent'] "
            f"is {count - begin} elements into it",
        )
