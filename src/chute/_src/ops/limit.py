"""`IterDataset.limit` / `experimental.LimitIterDataset`: at most `count` elements."""

from __future__ import annotations

from typing import Any, TypeVar

from chute._src.core import provenance
from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import DatasetIterator, bad_value, check_int, int_at
from chute._src.ops.repeat import check_count

T = TypeVar("T")


class LimitIterDataset(IterDataset[T]):
    """The first `count` elements of the stream.

    >>> import chute
    >>> list(chute.MapDataset.range(10).to_iter_dataset().limit(3))
    [0, 1, 2]
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, parent: IterDataset[T], count: int) -> None:
        super().__init__([parent])
        self._count = check_count(count, "count", "limit", allow_none=False) or 0

    def _make_iterator(self) -> DatasetIterator[T]:
        return _LimitIterator(self._parent_iter(), self._count)

    def __repr__(self) -> str:
        return f"LimitIterDataset(count={self._count})"

    def _fingerprint_params(self) -> str:
        return f"count={self._count}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        if position >= self._count:
            raise provenance.EndOfStream
        return provenance.same_position(position)


class _LimitIterator(DatasetIterator[T]):
    stage = "limit"

    def __init__(self, parent: DatasetIterator[T], count: int) -> None:
        super().__init__(parent)
        self._count = count
        self._taken = 0

    def __next__(self) -> T:
        if self._taken >= self._count:
            raise StopIteration
        x = next(self._parent)
        self._taken += 1
        return x

    def _next_many(self, n: int) -> list[T]:
        xs = self._parent._next_many(min(n, self._count - self._taken))
        self._taken += len(xs)
        return xs

    def own_state(self) -> dict[str, Any]:
        return {"taken": self._taken}

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        taken = check_int(
            state, "taken", path, 0, self._count, f"elements taken, at most count={self._count}"
        )
        count = self._parent._count_at(state["parent"])
        if count is not None and taken != count:
            raise bad_value(
                path,
                "taken",
                taken,
                f"every element taken comes from the parent, whose state {path}['parent'] has "
                f"handed out {count}",
            )
        self._taken = taken

    def _count_at(self, state: Any) -> int | None:
        return int_at(state, "taken")
