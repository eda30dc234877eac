"""`experimental.CacheIterDataset` / `IterDataset.cache()`: later passes from memory.

The iterator keeps the elements of its first pass over the parent; a pass that starts
again from the beginning (a `repeat` after the cache restores it to its start) is served
from memory without touching the parent. The cache lives in the iterator, never in its
state: a fresh iterator restored mid-pass continues from the parent's state (the cache
fills on the next full pass), or, for a state taken while replaying the cache, reads up
to there from the start.
"""

from __future__ import annotations

from typing import Any, TypeVar

from chute._src.dataset import IterDataset
from chute._src.iterator import DatasetIterator, bad_value, check_int, check_state

T = TypeVar("T")


class CacheIterDataset(IterDataset[T]):
    """Caches the stream in memory; repeating it replays the cache.

    >>> import chute
    >>> calls = []
    >>> ds = chute.MapDataset.range(3).to_iter_dataset().map(lambda x: calls.append(x) or x)
    >>> list(ds.cache().repeat(3)), len(calls)
    ([0, 1, 2, 0, 1, 2, 0, 1, 2], 3)
    """

    def __init__(self, parent: IterDataset[T]) -> None:
        super().__init__([parent])

    def make_iterator(self) -> DatasetIterator[T]:
        return _MemoryCacheIterator(self._parent_iter())

    def __repr__(self) -> str:
        return "CacheIterDataset()"


class _MemoryCacheIterator(DatasetIterator[T]):
    stage = "cache"

    def __init__(self, parent: DatasetIterator[T]) -> None:
        super().__init__(parent)
        self._start = parent.get_state()
        self._cache: list[T] = []
        self._filled = False
        self._pos = 0
        # Restored from a state served from memory into an iterator without the cache: the
        # rest of the pass is read from the parent, which ends at this state's parent state.
        self._end_state: Any = None

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
            self._filled = pos == len(self._cache)
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
        if self._end_state is not None and not self._filled:
            # As the state of a run that had the cache: served from memory, parent at its end.
            return {
                "stage": self.stage,
                "position": self._pos,
                "filled": 1,
                "parent": self._end_state,
            }
        return {
            "stage": self.stage,
            "position": self._pos,
            "filled": int(self._filled),
            "parent": self._parent.get_state(),
        }

    def _restore(self, state: Any, path: str) -> None:
        check_state(state, self.stage, {"stage", "position", "filled", "parent"}, path)
        pos = check_int(state, "position", path)
        filled = check_int(state, "filled", path, 0, 1, "1 while the pass is served from memory")
        self._end_state = None
        if filled:
            # Served from memory, the parent is not read; its state is still checked.
            self._parent._restore(state["parent"], f"{path}['parent']")
        if filled and self._filled:
            if pos > len(self._cache):
                raise bad_value(
                    path,
                    "position",
                    pos,
                    f"the stream cached has {len(self._cache)} elements",
                )
            self._pos = pos
            return
        if not filled:
            # The parent continues from there; the cache grows again once a pass from the
            # start reaches its end (a restored pass with a gap does not fill it).
            self._parent._restore(state["parent"], f"{path}['parent']")
            check_pass_position(self, state, self._start, pos, path)
            self._pos = pos
            return
        # A state taken while replaying a cache this iterator does not have: read up to
        # there from the start (filling the cache on the way).
        self._parent._restore(self._start, f"{path}['parent']")
        self._pos = 0
        while self._pos < pos:
            try:
                self.__next__()
            except StopIteration:
                raise bad_value(
                    path,
                    "position",
                    pos,
                    f"the stream cached has {self._pos} elements (found by reading it again)",
                ) from None
        self._end_state = state["parent"]


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
