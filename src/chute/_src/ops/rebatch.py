"""`experimental.RebatchIterDataset`: batches of a new size from batches of another."""

from __future__ import annotations

from typing import Any

import numpy as np

from chute._src.core import provenance, tree
from chute._src.core.dataset import IterDataset
from chute._src.core.element_spec import map_specs, parent_spec
from chute._src.core.iterator import MAX_POSITION, DatasetIterator
from chute._src.core.transforms import check_batch_size
from chute._src.ops.packing.common import (
    Mark,
    ReplayReader,
    check_mark,
    mark_state,
    replay_to_piece,
    restore_parent,
)


class RebatchIterDataset(IterDataset[Any]):
    """Splits and joins batched elements (leading axis) into batches of `batch_size`.

    The state is the position of the input batch holding the next row and the row's
    offset in it, never buffered rows.

    >>> import chute
    >>> ds = chute.MapDataset.range(7).to_iter_dataset().batch(3)
    >>> [b.tolist() for b in chute.experimental.RebatchIterDataset(ds, 2)]
    [[0, 1], [2, 3], [4, 5], [6]]
    """

    def __init__(self, parent: IterDataset[Any], batch_size: int, drop_remainder: bool = False):
        super().__init__([parent])
        self._size = check_batch_size(batch_size, "RebatchIterDataset")
        self._drop = bool(drop_remainder)

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _RebatchIterator(self._parent_iter(), self)

    def __repr__(self) -> str:
        return f"RebatchIterDataset(batch_size={self._size}, drop_remainder={self._drop})"

    def _fingerprint_params(self) -> str:
        return f"batch_size={self._size}, drop_remainder={self._drop}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The records of the rows batch `position` takes from its parent's batches, each
        at its row here: the parent's batches up to it are computed (once per `provenance`
        call) to count their rows, and their records found below; nothing above runs."""
        memo = tracer.memo(self)
        plan: list[list[tuple[int, int, int]]] = memo.setdefault("plan", [])
        stream = tracer.stream(self._parents[0])
        while len(plan) <= position:
            if memo.get("ended"):
                raise provenance.EndOfStream
            at, offset, rows = memo.get("at", (-1, 0, 0))  # the input batch being split
            parts, need = [], self._size
            while need:
                if offset >= rows:
                    try:
                        x = stream.get(at + 1)
                    except provenance.EndOfStream:
                        memo["ended"] = True
                        break
                    at, offset, rows = at + 1, 0, _rows(x, at + 1)
                take = min(need, rows - offset)
                parts.append((at, offset, offset + take))
                offset, need = offset + take, need - take
            memo["at"] = (at, offset, rows)
            if parts and not (self._drop and need):
                plan.append(parts)
        return provenance.rows_of(self._parents[0], plan[position], tracer)

    @property
    def _element_spec(self) -> Any:
        # As Grain: every leaf's leading (batch) axis becomes `batch_size`.
        return map_specs(
            lambda x: type(x)(shape=(self._size, *x.shape[1:]), dtype=x.dtype),
            parent_spec(self._parents[0]),
        )


def _rows(batch: Any, index: int) -> int:
    sizes = {int(np.shape(x)[0]) for x in tree.leaves(batch) if np.ndim(x) > 0}
    if len(sizes) != 1 or any(np.ndim(x) == 0 for x in tree.leaves(batch)):
        raise ValueError(
            f"RebatchIterDataset: input {index} has leaves with leading sizes "
            f"{sorted(sizes)} (or scalars): every leaf of a batch needs the same leading "
            "(batch) axis; rebatch the output of .batch(...)."
        )
    rows = sizes.pop()
    if rows == 0:
        raise ValueError(
            f"RebatchIterDataset: input {index} is an empty batch (leading size 0): "
            "rebatching with a starting batch size of 0 is not supported, as in Grain; "
            "filter out the empty batches first (e.g. .filter(lambda b: len(b) > 0))."
        )
    return rows


class _RebatchIterator(DatasetIterator[Any]):
    stage = "rebatch"

    def __init__(self, parent: DatasetIterator[Any], ds: RebatchIterDataset) -> None:
        super().__init__(parent)
        self._size, self._drop = ds._size, ds._drop
        self._reader = ReplayReader(parent)
        self._cur: Any = None
        self._cur_rows = 0
        self._cur_mark: Mark | None = None
        self._offset = 0
        self._seen = 0

    def _read(self) -> None:
        self._cur = self._reader.next()
        self._cur_rows = _rows(self._cur, self._seen)
        self._seen += 1
        self._cur_mark = self._reader.last_mark()
        self._offset = 0

    def __next__(self) -> Any:
        parts: list[Any] = []
        need = self._size
        while need:
            if self._cur is None or self._offset >= self._cur_rows:
                try:
                    self._read()
                except StopIteration:
                    self._cur = None
                    break
            take = min(need, self._cur_rows - self._offset)
            parts.append(tree.map_leaves(_Slicer(self._offset, self._offset + take), self._cur))
            self._offset += take
            need -= take
        if not parts or (self._drop and need):
            raise StopIteration
        if len(parts) == 1:
            return parts[0]
        return _concat(parts)

    def get_state(self) -> dict[str, Any]:
        if self._cur is None or self._offset >= self._cur_rows:
            mark = self._reader.mark()
        else:
            assert self._cur_mark is not None
            mark = self._cur_mark.at_piece(self._offset)
        return mark_state(self.stage, mark, self._reader)

    def _restore(self, state: Any, path: str) -> None:
        mark = check_mark(
            self, state, path, (), MAX_POSITION, "the offset of the next row in an input batch"
        )
        restore_parent(self, mark, path)
        self._reader.seek(mark, path)
        self._cur = None
        if mark.piece:

            def refill() -> int:
                self._read()
                return self._cur_rows

            replay_to_piece(mark, path, refill, "the input batch there has {n} rows")
            self._offset = mark.piece
            self._cur_mark = mark.at_piece(0)  # the state restored, exactly
        self._reader.settle(path)


class _Slicer:
    __slots__ = ("hi", "lo")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi

    def __call__(self, x: Any) -> Any:
        return x[self.lo : self.hi]


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, dict):
        return type(first)((k, _concat([p[k] for p in parts])) for k in first)
    if isinstance(first, list | tuple) and not hasattr(first, "_fields"):
        return type(first)(_concat([p[i] for p in parts]) for i in range(len(first)))
    try:
        return np.concatenate(parts)
    except ValueError as e:
        shapes = sorted({np.shape(p)[1:] for p in parts})
        raise ValueError(
            f"RebatchIterDataset: rows of shapes {shapes} cannot form one batch: rows of "
            "different input batches must have equal shapes; pad to a fixed length "
            "(batch(..., padding_struct=...)) rather than to the longest."
        ) from e
