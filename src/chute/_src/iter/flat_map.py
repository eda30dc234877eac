"""`experimental.FlatMapIterDataset`: every element becomes zero or more elements."""

from __future__ import annotations

from typing import Any

from chute._src.dataset import IterDataset
from chute._src.iter.pack_common import (
    Mark,
    ReplayReader,
    check_mark,
    mark_state,
    replay_to_piece,
    restore_parent,
)
from chute._src.iterator import MAX_POSITION, DatasetIterator
from chute._src.map.flat_map import FlatMapTransform, check_transform, split
from chute._src.transforms import describe


class FlatMapIterDataset(IterDataset[Any]):
    """The parts `transform.flat_map(x)` of every element `x`, in order.

    The state is the position of the element being split and how many of its parts were
    handed out; restoring splits it again.

    >>> import chute
    >>> class Words(chute.experimental.FlatMapTransform):
    ...     max_fan_out = 10
    ...     def flat_map(self, text):
    ...         return text.split()
    >>> ds = chute.MapDataset.source(["a b", "", "c"]).to_iter_dataset()
    >>> list(chute.experimental.FlatMapIterDataset(ds, Words()))
    ['a', 'b', 'c']
    """

    def __init__(self, parent: IterDataset[Any], transform: FlatMapTransform) -> None:
        super().__init__([parent])
        self._t = check_transform(transform, "FlatMapIterDataset", fan_out_needed=False)

    def make_iterator(self) -> DatasetIterator[Any]:
        return _FlatMapIterator(self._parent_iter(), self)

    def __repr__(self) -> str:
        return f"FlatMapIterDataset(transform={describe(self._t)})"

    def _fingerprint_params(self) -> str:
        return f"max_fan_out={self._t.max_fan_out}"


class _FlatMapIterator(DatasetIterator[Any]):
    stage = "flat_map"

    def __init__(self, parent: DatasetIterator[Any], ds: FlatMapIterDataset) -> None:
        super().__init__(parent)
        self._ds = ds
        self._reader = ReplayReader(parent)
        self._parts: list[Any] = []
        self._next = 0
        self._mark: Mark | None = None
        self._seen = 0

    def _split_next(self) -> None:
        x = self._reader.next()
        self._mark = self._reader.last_mark()
        self._parts = split(self._ds._t, x, self._ds, self._seen)
        self._seen += 1
        self._next = 0

    def __next__(self) -> Any:
        while self._next >= len(self._parts):
            self._split_next()
        x = self._parts[self._next]
        self._next += 1
        return x

    def get_state(self) -> dict[str, Any]:
        if self._next >= len(self._parts) or self._mark is None:
            return mark_state(self.stage, self._reader.mark())
        m = self._mark
        return mark_state(self.stage, Mark(m.parent_state, m.skip, self._next))

    def _restore(self, state: Any, path: str) -> None:
        fan = self._ds._t.max_fan_out
        mark = check_mark(
            self,
            state,
            path,
            (),
            MAX_POSITION if fan is None else fan - 1,
            f"the parts of one element already handed out: at most max_fan_out={fan}",
        )
        restore_parent(self, mark, path)
        self._reader.seek(mark, path)
        self._parts, self._next, self._mark = [], 0, None
        if mark.piece:

            def refill() -> int:
                self._split_next()
                return len(self._parts)

            replay_to_piece(mark, path, refill, "the element there has {n} parts")
            self._next = mark.piece
            self._mark = Mark(mark.parent_state, mark.skip)  # the state restored, exactly
