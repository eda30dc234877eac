"""Provenance for stages that group elements by what they hold (buckets, batching by
tokens, packing): run the stage's own rule again, on its parent's elements marked with
their positions, and read the positions back from what it hands out.

The stage builds a twin of itself on `PositionedParent` (its `_with_parents`), which
yields the parent's elements (computed once per `provenance` call by the tracer's stream,
so nothing above the parent runs twice), each passed through `tag(element, position)`:

- a stage that combines its elements with a function (a padder) gives its twin one that
  returns the elements' positions (`positions_of`); the elements are shallow copies, so
  each is known by its identity;
- a packer, which copies the tokens of its features, is given elements whose packed
  features hold their position in every token (`tokens_as_positions`), and reads the
  positions from each row's segments (`segments_of_row`).

The rule is the stage's own, so placements are the same as in the run: they depend on
lengths, seeds and the order of the stream, never on the values replaced.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from chute._src.core import contract
from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.core.provenance import EndOfStream, Origin, Stream, Tracer


class _PositionedIterator(DatasetIterator[Any]):
    stage = "provenance_positions"

    def __init__(self, ds: PositionedParent) -> None:
        super().__init__()
        self._ds = ds
        self._next = 0

    def __next__(self) -> Any:
        try:
            x = self._ds.stream.get(self._next)
        except EndOfStream:
            raise StopIteration from None
        out = self._ds.tag(x, self._next)
        self._ds.positions[id(out)] = self._next
        self._ds.alive.append(out)
        self._next += 1
        return out

    def get_state(self) -> dict[str, Any]:
        return {"next": self._next}

    def set_state(self, state: dict[str, Any]) -> None:
        self._next = int(state["next"])


class PositionedParent(IterDataset[Any]):
    """The elements of `stream`, each through `tag(element, position)`; `positions` maps
    the identity of each element handed out to its position."""

    def __init__(self, stream: Stream, tag: Callable[[Any, int], Any]) -> None:
        super().__init__()
        self.stream = stream
        self.tag = tag
        self.positions: dict[int, int] = {}
        self.alive: list[Any] = []  # the elements handed out, so that identities stay unique

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _PositionedIterator(self)


def shallow_copy(element: Any, position: int) -> Any:
    """A new object for each element (a dict, an array view...), known by its identity."""
    if isinstance(element, np.ndarray):
        return element.view()
    return copy.copy(element)


def replayed_origins(
    stage: Any,
    position: int,
    tracer: Tracer,
    make_twin: Callable[[list[PositionedParent]], IterDataset[Any]],
    read: Callable[[Any, list[PositionedParent]], list[Origin]],
    tag: Callable[[Any, int], Any] = shallow_copy,
) -> list[Origin]:
    """The origins of `stage`'s element at `position`: its twin (`make_twin(parents)`, one
    `PositionedParent` per parent) is run up to that element (once per `provenance` call),
    and `read(element, parents)` gives the origins of its parts."""
    memo = tracer.memo(stage)
    if "twin" not in memo:
        parents = [PositionedParent(tracer.stream(p), tag) for p in stage.parents]
        memo["parents"], memo["twin"], memo["out"] = parents, make_twin(parents), []
    out: list[list[Origin]] = memo["out"]
    while len(out) <= position:
        if memo.get("ended"):
            raise EndOfStream
        it = memo.get("it")
        if it is None:
            it = memo["it"] = tracer.closing(iter(memo["twin"]))
        try:
            element = next(it)
        except StopIteration:
            memo["ended"] = True
            continue
        out.append(read(element, memo["parents"]))
    return out[position]


def positions_of(elements: list[Any], parent: PositionedParent) -> list[int]:
    """What a twin's combining function returns: its elements' positions."""
    return [parent.positions[id(x)] for x in elements]


def as_rows(positions: Any, parents: list[PositionedParent]) -> list[Origin]:
    """`read` for a twin that hands out `positions_of` lists: each with its row."""
    return [Origin(0, int(p), (row,)) for row, p in enumerate(positions)]


def by_identity(element: Any, parents: list[PositionedParent]) -> list[Origin]:
    """`read` for a twin that hands out its parents' elements themselves, reordered (an
    interleave, a window shuffle): the parent and position that element was read at."""
    for i, parent in enumerate(parents):
        at = parent.positions.get(id(element))
        if at is not None:
            return [Origin(i, at)]
    raise AssertionError(f"{element!r} was not read from a parent")


def reordered_origins(stage: Any, position: int, tracer: Tracer) -> list[Origin]:
    """The origin of the element at `position` of a stage that hands out its parents'
    elements in another order: its twin run on its parents' elements, known by identity."""
    return replayed_origins(
        stage, position, tracer, lambda ps: contract.with_parents(stage, ps), by_identity
    )


def tokens_as_positions(paths: list[Any]) -> Callable[[Any, int], Any]:
    """A `tag` that replaces each feature at `paths` (a key, or a tuple of keys) with its
    position, in every token."""

    def tag(element: Any, position: int) -> Any:
        out = dict(element)
        for path in paths:
            keys = (path,) if isinstance(path, str) else tuple(path)
            node = out
            for k in keys[:-1]:
                node[k] = dict(node[k])
                node = node[k]
            leaf = np.asarray(node[keys[-1]])
            node[keys[-1]] = np.full(np.atleast_1d(leaf).shape, position, dtype=np.int64)
        return out

    return tag


def segments_of_row(feature: str) -> Callable[[Any, list[PositionedParent]], list[Origin]]:
    """A `read` for a packed row whose `feature` holds positions: each segment's position,
    with its offset (the token it starts at) in the row."""

    def read(row: Any, parents: list[PositionedParent]) -> list[Origin]:
        values = np.asarray(row[feature]).reshape(-1)
        seg = np.asarray(row[f"{feature}_segment_ids"]).reshape(-1)
        out = []
        for s in dict.fromkeys(seg[seg != 0].tolist()):
            at = np.flatnonzero(seg == s)
            out.append(Origin(0, int(values[at[-1]]), (int(at[0]),)))
        return out

    return read


def packed_origins(stage: Any, spec: Any, position: int, tracer: Tracer) -> list[Origin]:
    """The origins of a packer's row: its twin packs elements whose features (`spec.keys`)
    hold their positions, and each segment of the row's first sequence feature names one."""
    from chute._src.core.provenance import ProvenanceError

    seq = [k for k in spec.keys if isinstance(k, str) and not spec.is_meta(k)]
    if not seq:
        raise ProvenanceError(
            f"provenance: {stage!r} packs only meta features, which have no segment ids to "
            "tell its sequences apart: add a sequence feature to length_struct."
        )
    return replayed_origins(
        stage,
        position,
        tracer,
        lambda ps: contract.with_parents(stage, ps),
        segments_of_row(seq[0]),
        tokens_as_positions(list(spec.keys)),
    )


def _at_path(tree: Any, path: tuple[Any, ...], leaf: Callable[[Any], Any]) -> Any:
    """`tree` (dicts, lists, tuples) with its value at `path` replaced by `leaf(value)`,
    the containers on the way copied; a path it does not have is left for the stage to
    report (its twin then raises as the run did)."""
    if not path:
        return leaf(tree)
    key, rest = path[0], path[1:]
    if isinstance(tree, Mapping) and key in tree:
        out = dict(tree)
        out[key] = _at_path(tree[key], rest, leaf)
        return out
    if isinstance(tree, list | tuple) and isinstance(key, int) and -len(tree) <= key < len(tree):
        items = list(tree)
        items[key] = _at_path(items[key], rest, leaf)
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return tree


def features_as_positions(paths: list[tuple[Any, ...]]) -> Callable[[Any, int], Any]:
    """A `tag` that replaces the feature at each of `paths` (tuples of keys and indices)
    with its position in every cell, keeping its shape."""

    def tag(element: Any, position: int) -> Any:
        def fill(value: Any) -> Any:
            return np.full(np.shape(value), position, dtype=np.int64)

        for path in paths:
            element = _at_path(element, path, fill)
        return element

    return tag


def packed_batch_origins(
    stage: Any, paths: list[tuple[Any, ...]], position: int, tracer: Tracer
) -> list[Origin]:
    """The origins of a packed batch `(data, segments, positions)` (`PackAndBatch`): its
    twin packs elements whose features (at `paths`) hold their position, and each segment
    of each row names one, with its offset (its row, the token it starts at in the first
    feature it has tokens in), in the order of the segment ids. A sequence with no tokens
    in any feature leaves no segment to read."""

    def leaf(tree: Any, path: tuple[Any, ...]) -> np.ndarray:
        for key in path:
            tree = tree[key]
        return np.asarray(tree)

    def read(batch: Any, parents: list[PositionedParent]) -> list[Origin]:
        features = [(leaf(batch[0], p), leaf(batch[1], p)) for p in paths]
        out = []
        for row in range(features[0][1].shape[0]):
            found: dict[int, Origin] = {}
            for data, segments in features:
                seg = segments[row]
                for s in dict.fromkeys(seg[seg != 0].tolist()):
                    if s not in found:
                        at = int(np.flatnonzero(seg == s)[0])
                        value = np.asarray(data[row, at]).reshape(-1)[0]
                        found[s] = Origin(0, int(value), (row, at))
            out += [found[s] for s in sorted(found)]
        return out

    return replayed_origins(
        stage,
        position,
        tracer,
        lambda ps: contract.with_parents(stage, ps),
        read,
        features_as_positions(paths),
    )


def padded_origins(stage: Any, position: int, tracer: Any) -> list[Any]:
    """The elements of a padded batch `position` of `stage` (buckets, batches shaped by
    the data) with their rows: the stage's rule run again on its parent's elements, with a
    padder that returns their positions; the parent's elements are computed, nothing else.
    The stage pads through its `_padder`, called as `(elements, pad)`."""

    def twin(parents: list[PositionedParent]) -> Any:
        new = stage._with_parents(parents)
        new._padder = lambda elements, pad: positions_of(elements, parents[0])
        return new

    return replayed_origins(stage, position, tracer, twin, as_rows)
