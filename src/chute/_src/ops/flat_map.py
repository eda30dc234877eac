"""`experimental.FlatMapMapDataset` and `FlatMapTransform`: one element into several.

`experimental.FlatMapIterDataset`: every element becomes zero or more elements.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core import provenance
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.errors import add_stage_note
from chute._src.core.iterator import MAX_POSITION, DatasetIterator
from chute._src.core.transforms import describe
from chute._src.ops.packing.common import (
    Mark,
    ReplayReader,
    check_mark,
    mark_state,
    replay_to_piece,
    restore_parent,
)


class FlatMapTransform(abc.ABC):
    """Splits one element into at most `max_fan_out` elements (`flat_map` returns them).

    `FlatMapMapDataset` needs `max_fan_out` (element `i` owns positions
    `[i * max_fan_out, (i + 1) * max_fan_out)`); `FlatMapIterDataset` accepts
    `max_fan_out = None` for no limit (as Grain's, which does not read it there); a
    subclass that does not set it has None.
    """

    max_fan_out: int | None = None

    @abc.abstractmethod
    def flat_map(self, element: Any) -> Sequence[Any]:
        """The elements `element` becomes."""


def check_transform(transform: Any, where: str, *, fan_out_needed: bool = True) -> FlatMapTransform:
    if not isinstance(transform, FlatMapTransform):
        raise TypeError(
            f"{where}: transform={transform!r} is not a FlatMapTransform: subclass "
            "chute.experimental.FlatMapTransform with max_fan_out and flat_map(element)."
        )
    fan = getattr(transform, "max_fan_out", None)
    if fan is None and not fan_out_needed:
        return transform
    if isinstance(fan, bool) or not isinstance(fan, int) or fan < 1:
        also = "" if fan_out_needed else " (or None for no limit)"
        raise ValueError(
            f"{where}: {type(transform).__name__}.max_fan_out = {fan!r} is invalid: it must be "
            f"a positive int{also}, the most elements one element can become."
        )
    return transform


def split(transform: FlatMapTransform, element: Any, stage: object, index: int) -> list[Any]:
    try:
        parts = list(transform.flat_map(element))
    except Exception as e:
        add_stage_note(e, stage, index)
        raise
    if transform.max_fan_out is not None and len(parts) > transform.max_fan_out:
        raise ValueError(
            f"{type(transform).__name__}.flat_map made {len(parts)} elements from element "
            f"{index}, over max_fan_out={transform.max_fan_out}: raise max_fan_out, or split "
            "the data before (a large max_fan_out makes the MapDataset sparse)."
        )
    return parts


class FlatMapMapDataset(MapDataset[Any]):
    """Element `i * max_fan_out + j` is part `j` of parent element `i` (None past its parts,
    skipped when iterating).

    >>> import chute
    >>> class Repeat(chute.experimental.FlatMapTransform):
    ...     max_fan_out = 3
    ...     def flat_map(self, x):
    ...         return [x] * x
    >>> ds = chute.experimental.FlatMapMapDataset(chute.MapDataset.range(4), Repeat())
    >>> len(ds), list(ds)
    (12, [1, 2, 2, 3, 3, 3])
    """

    def __init__(self, parent: MapDataset[Any], transform: FlatMapTransform) -> None:
        super().__init__([parent])
        self._t = check_transform(transform, "FlatMapMapDataset")
        self._may_be_none = True
        n = len(parent)
        fan = self._fan = int(self._t.max_fan_out)  # type: ignore[arg-type]  # checked
        self._len = INFINITE if n >= INFINITE // fan else n * fan

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        fan = self._fan
        parents, parts = np.divmod(indices, fan)
        unique, inverse = np.unique(parents, return_inverse=True)
        elements = self._parents[0]._getitems(unique)
        splits = [
            None if x is None else split(self._t, x, self, int(i))
            for i, x in zip(unique.tolist(), elements)
        ]
        out: list[Any] = []
        for u, j in zip(inverse.tolist(), parts.tolist()):
            s = splits[u]
            out.append(s[j] if s is not None and j < len(s) else None)
        return out

    def __repr__(self) -> str:
        return f"FlatMapMapDataset(transform={describe(self._t)})"

    def _fingerprint_params(self) -> str:
        return f"max_fan_out={self._t.max_fan_out}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """Part `j` of parent element `i` (`i, j = divmod(position, max_fan_out)`), with
        the record's `part`; none past its parts or where the parent has a hole. The
        parent's element is computed and split (once per `provenance` call) to count its
        parts; nothing above this stage runs."""
        i, j = divmod(position, self._fan)
        counts: dict[int, int] = tracer.memo(self).setdefault("parts", {})
        if i not in counts:
            x = tracer.element(self._parents[0], i)
            counts[i] = 0 if x is None else len(split(self._t, x, self, i))
        return [provenance.Origin(0, i, fields=(("part", j),))] if j < counts[i] else []


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

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _FlatMapIterator(self._parent_iter(), self)

    def __repr__(self) -> str:
        return f"FlatMapIterDataset(transform={describe(self._t)})"

    def _fingerprint_params(self) -> str:
        return f"max_fan_out={self._t.max_fan_out}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """Part `j` of the parent's step `i`, with the record's `part`: the parent's
        elements up to it are computed and split (once per `provenance` call) to count
        their parts; nothing above this stage runs."""
        memo = tracer.memo(self)
        steps: list[int] = memo.setdefault("steps", [])  # the parent step of each part
        parts: list[int] = memo.setdefault("parts", [])  # its part there
        stream = tracer.stream(self._parents[0])
        while len(steps) <= position:
            i = memo.get("next", 0)
            n = len(split(self._t, stream.get(i), self, i))  # EndOfStream past the end
            memo["next"] = i + 1
            steps += [i] * n
            parts += range(n)
        return [provenance.Origin(0, steps[position], fields=(("part", parts[position]),))]


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
            return mark_state(self.stage, self._reader.mark(), self._reader)
        m = self._mark
        return mark_state(self.stage, m.at_piece(self._next), self._reader)

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
            self._mark = mark.at_piece(0)  # the state restored, exactly
        self._reader.settle(path)
