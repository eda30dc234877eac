"""Grain's older packer, `PackAndBatchOperation`, as a stage: sequences packed into the
rows of fixed-size batches.

The rule, as Grain's: a batch has `batch_size` rows, each `length_struct[f]` long for
every feature `f`. Each sequence, in stream order, goes to the first row where every
feature still fits (and that holds fewer than `max_sequences_per_bin` sequences); the
first sequence that fits no row closes the batch, which is emitted whole (rows left empty
are zeros), and starts the next. A batch is `(data, segmentations, positions)`: `data`
shaped like `length_struct` with leaves `(batch_size, length, ...)` in the dtype of the
batch's first sequence, and for every feature its segment ids (1-based per row, 0 in
padding) and positions (0-based in each segment), int32 `(batch_size, length)`.

The state is where the open batch begins upstream (`packing/common.py`: replay, never
store): restoring re-reads from there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chute._src.core import provenance_replay as replay
from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.ops.packing.common import (
    Mark,
    ReplayReader,
    check_mark,
    mark_state,
    restore_parent,
)

WHERE = "PackAndBatchOperation"


class Layout:
    """The features named by a `length_struct` (a pytree of positive ints: dicts, lists,
    tuples), flattened in one order, and how to build a tree of that shape again."""

    def __init__(self, length_struct: Any, where: str = WHERE) -> None:
        self.where = where
        self.struct = length_struct
        self.paths: list[tuple[Any, ...]] = []
        self.caps: list[int] = []
        self._walk(length_struct, ())
        if not self.caps:
            raise ValueError(
                f"{where}: length_struct={length_struct!r} names no feature: give a length "
                'per packed feature, e.g. {"inputs": 128, "targets": 128}.'
            )

    def _walk(self, node: Any, path: tuple[Any, ...]) -> None:
        if isinstance(node, Mapping):
            for k in node:
                self._walk(node[k], (*path, k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                self._walk(v, (*path, i))
        elif isinstance(node, bool) or not isinstance(node, int | np.integer) or node < 1:
            raise ValueError(
                f"{self.where}: length_struct{_show(path)} = {node!r} is invalid: every "
                'leaf is the packed length of a feature, a positive int (e.g. {"inputs": 128}).'
            )
        else:
            self.paths.append(path)
            self.caps.append(int(node))

    def leaves(self, element: Any, index: int) -> list[np.ndarray]:
        """The features of `element` in layout order, as arrays with a sequence axis."""
        out = []
        for path in self.paths:
            value = element
            for depth, key in enumerate(path):
                try:
                    value = value[key]
                except (KeyError, IndexError, TypeError):
                    raise ValueError(
                        f"{self.where}: element {index} has no feature {_show(path[: depth + 1])}"
                        f" (length_struct has it): elements must have the structure of "
                        "length_struct; fix length_struct or the map that builds them."
                    ) from None
            array = np.asarray(value)
            if array.ndim == 0:
                raise ValueError(
                    f"{self.where}: feature {_show(path)} of element {index} is a scalar "
                    f"({value!r}): packed features are sequences; wrap it in a list, or "
                    "leave it out of length_struct."
                )
            out.append(array)
        return out

    def build(self, leaves: Sequence[Any]) -> Any:
        """A tree shaped like `length_struct` with `leaves` in layout order."""
        it = iter(leaves)

        def rebuild(node: Any) -> Any:
            if isinstance(node, Mapping):
                return type(node)((k, rebuild(node[k])) for k in node)  # type: ignore[call-arg]
            if isinstance(node, tuple) and hasattr(node, "_fields"):
                return type(node)(*(rebuild(v) for v in node))
            if isinstance(node, list | tuple):
                return type(node)(rebuild(v) for v in node)
            return next(it)

        return rebuild(self.struct)


def _show(path: Sequence[Any]) -> str:
    return "".join(f"[{k!r}]" for k in path)


class PackedBatch:
    """One batch being filled: `batch_size` rows per feature."""

    def __init__(
        self, first: list[np.ndarray], layout: Layout, batch_size: int, max_seqs: int | None
    ) -> None:
        self.layout = layout
        self.size = batch_size
        self.max_seqs = max_seqs
        self.data = [
            np.zeros((batch_size, cap, *x.shape[1:]), dtype=x.dtype)
            for x, cap in zip(first, layout.caps)
        ]
        self.segments = [np.zeros((batch_size, cap), dtype=np.int32) for cap in layout.caps]
        self.positions = [np.zeros((batch_size, cap), dtype=np.int32) for cap in layout.caps]
        self.free = [[0] * batch_size for _ in layout.caps]  # first free cell per row
        self.counts = [0] * batch_size  # sequences per row

    def try_add(self, leaves: list[np.ndarray], index: int) -> bool:
        """Places a sequence in the first row it fits; False when it fits none."""
        caps = self.layout.caps
        lengths = [len(x) for x in leaves]
        over = [(p, n, c) for p, n, c in zip(self.layout.paths, lengths, caps) if n > c]
        if over:
            detail = ", ".join(f"{_show(p)} has {n} > {c}" for p, n, c in over)
            raise ValueError(
                f"{WHERE}: element {index} is longer than a row ({detail}): cut sequences to "
                "their packed length before packing (e.g. a map taking x[:128]). (In Grain's "
                "words: Inputs to PackAndBatchOperation must be truncated to max length.)"
            )
        for row in range(self.size):
            if self.max_seqs is not None and self.counts[row] >= self.max_seqs:
                continue
            if all(free[row] + n <= c for free, n, c in zip(self.free, lengths, caps)):
                self._add(leaves, lengths, row)
                return True
        return False

    def _add(self, leaves: list[np.ndarray], lengths: list[int], row: int) -> None:
        segment = self.counts[row] + 1
        for f, (x, n) in enumerate(zip(leaves, lengths)):
            start = self.free[f][row]
            end = start + n
            try:
                self.data[f][row, start:end] = x
            except ValueError as e:
                raise ValueError(
                    f"{WHERE}: feature {_show(self.layout.paths[f])} has shape {x.shape}, but "
                    f"the batch's rows are {self.data[f].shape[1:]}: only the first "
                    "(sequence) axis of a feature may vary; make the others equal."
                ) from e
            self.segments[f][row, start:end] = segment
            self.positions[f][row, start:end] = np.arange(n, dtype=np.int32)
            self.free[f][row] = end
        self.counts[row] = segment

    def result(self) -> tuple[Any, Any, Any]:
        build = self.layout.build
        return build(self.data), build(self.segments), build(self.positions)


def check_batch_args(batch_size: Any, max_sequences_per_bin: Any) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"{WHERE}: batch_size={batch_size!r} is invalid: it must be a positive int (the "
            "rows of a packed batch)."
        )
    if max_sequences_per_bin is not None and (
        isinstance(max_sequences_per_bin, bool)
        or not isinstance(max_sequences_per_bin, int)
        or max_sequences_per_bin < 1
    ):
        raise ValueError(
            f"{WHERE}: max_sequences_per_bin={max_sequences_per_bin!r} is invalid: it must "
            "be a positive int, or None for no limit."
        )


class PackAndBatchIterDataset(IterDataset[tuple[Any, Any, Any]]):
    """The stage a `DataLoader` builds for a `PackAndBatchOperation` (module docstring).

    >>> import chute
    >>> seqs = [{"t": [1, 2, 3]}, {"t": [4]}, {"t": [5, 6]}]
    >>> ds = PackAndBatchIterDataset(chute.MapDataset.source(seqs).to_iter_dataset(),
    ...                              length_struct={"t": 4}, batch_size=2)
    >>> data, segments, positions = next(iter(ds))
    >>> data["t"].tolist(), segments["t"].tolist()
    ([[1, 2, 3, 4], [5, 6, 0, 0]], [[1, 1, 1, 2], [1, 1, 0, 0]])
    """

    def __init__(
        self,
        parent: IterDataset[Any],
        *,
        length_struct: Any,
        batch_size: int,
        max_sequences_per_bin: int | None = None,
    ) -> None:
        super().__init__([parent])
        check_batch_args(batch_size, max_sequences_per_bin)
        self._layout = Layout(length_struct)
        self._size = batch_size
        self._max_seqs = max_sequences_per_bin

    def _make_iterator(self) -> DatasetIterator[tuple[Any, Any, Any]]:
        return _PackAndBatchIterator(self._parent_iter(), self)

    def __repr__(self) -> str:
        return (
            f"PackAndBatchIterDataset(length_struct={self._layout.struct!r}, "
            f"batch_size={self._size}, max_sequences_per_bin={self._max_seqs})"
        )

    def _fingerprint_params(self) -> str:
        layout = self._layout
        return f"{layout.paths}, {layout.caps}, batch_size={self._size}, max={self._max_seqs}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The sequences of batch `position`, each with its row and the token it starts at
        (in the first feature it has tokens in): this stage's rule run again on its
        parent's elements whose packed features hold their position
        (`core/provenance_replay.py`); the parent's elements are computed, nothing else."""
        return replay.packed_batch_origins(self, self._layout.paths, position, tracer)


class _PackAndBatchIterator(DatasetIterator[tuple[Any, Any, Any]]):
    """Fills a batch, emits it; the state is where the open batch begins upstream."""

    stage = "pack_and_batch"

    def __init__(self, parent: DatasetIterator[Any], ds: PackAndBatchIterDataset) -> None:
        super().__init__(parent)
        self._ds = ds
        self._reader = ReplayReader(parent)
        self._carry: list[np.ndarray] | None = None  # the sequence that closed the last batch
        self._carry_mark: Mark | None = None
        self._seen = 0  # sequences read, to name a bad one

    def __next__(self) -> tuple[Any, Any, Any]:
        ds = self._ds
        batch: PackedBatch | None = None
        if self._carry is not None:
            batch = PackedBatch(self._carry, ds._layout, ds._size, ds._max_seqs)
            batch.try_add(self._carry, self._seen - 1)
            self._carry = self._carry_mark = None
        while True:
            try:
                element = self._reader.next()
            except StopIteration:
                if batch is None:
                    raise
                return batch.result()
            leaves = ds._layout.leaves(element, self._seen)
            self._seen += 1
            if batch is None:
                batch = PackedBatch(leaves, ds._layout, ds._size, ds._max_seqs)
            if not batch.try_add(leaves, self._seen - 1):
                self._carry, self._carry_mark = leaves, self._reader.last_mark()
                return batch.result()

    def get_state(self) -> dict[str, Any]:
        start = self._carry_mark if self._carry_mark is not None else self._reader.mark()
        return mark_state(self.stage, start, self._reader)

    def _restore(self, state: Any, path: str) -> None:
        mark = check_mark(self, state, path, (), 0, "this packer does not split sequences")
        restore_parent(self, mark, path)
        self._reader.seek(mark, path)
        self._carry = self._carry_mark = None
        self._reader.settle(path)
