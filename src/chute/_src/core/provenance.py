"""`provenance`: the source records behind steps of a pipeline, found from positions.

Step `k` is the `k`-th thing a pipeline yields from its start. Each stage says where the
element at one of its positions came from through one method of the stage contract,
`_origins(position, tracer)` (defaults in `core/node.py`, by role):

- a source returns one `Origin` with `parent=None`: the record's index in the source and
  what the source knows of it (epoch; file, shard and record number for record files);
- any other stage returns the `Origin`s of its element in its parents: which parent, the
  position there, and (a grouping stage) the offset of that part in its own element.

Element-wise stages (maps, prefetching, worker processes, a seed) hand on their position
unchanged: they are never run. Index stages (shuffle, slice, repeat, batch, mix of a
`MapDataset`) compute the parents' positions with the arithmetic they read with. A stage
that must look at elements to know (a filter, a `MapDataset` whose filter leaves holes,
batching by tokens) asks the `Tracer` for its parent's elements, computed once per call and
only up to the position asked for; nothing above that stage is computed.

Weights a mixture was given at run time (`set_weights`) are read from the iterator (or
the state restored into one) by mixture: `changes_by_mixture` matches each mixture's
iterator with its node, both met in the same depth-first order, and each mixture draws
with its own (`Tracer.changes_of`), in index arithmetic and in the streams replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from chute._src.core.contract import StageRole, origins, role

Label = str | int | None


class Origin(NamedTuple):
    """Where part of a stage's element came from.

    `parent`: which of the stage's parents (None: this stage is the source, and
    `position` is the record's index in it); `position`: the position in that parent (an
    index of a `MapDataset`, a step of an `IterDataset`); `offset`: where this part sits in
    the stage's own element (its row in a batch, the token a sequence starts at in a packed
    row, its part of a zipped tuple), empty for a stage that does not group; `source`: the name of the parent as the records should
    show it (a mixture's component); `fields`: for a source, more about the record (its
    epoch, file, shard, record number); for a stage, what it adds to the records below
    (a shard's number; `epoch`: the passes of a repeated stream, added to the source's)."""

    parent: int | None
    position: int
    offset: tuple[int, ...] = ()
    source: Label = None
    fields: tuple[tuple[str, Any], ...] = ()


class ProvenanceError(ValueError):
    """The records behind a step cannot be named: the step is past the end of the stream,
    or a stage does not declare where its elements come from."""


class EndOfStream(Exception):
    """A position past the end of a stage's elements (internal: becomes ProvenanceError).
    With an argument: the run raises there instead of ending (a strict zip of streams of
    other lengths), and the argument says what it raises; a stage that asks whether its
    parent has an element there (`Tracer.exists`) sees an end, as the run's stages that
    read ahead in chunks do (they hand out what came before the error)."""


def same_position(position: int) -> list[Origin]:
    """The origins of an element-wise stage's element: its parent's at the same position."""
    return [Origin(0, position)]


def source_record(index: int, length: int, **fields: Any) -> list[Origin]:
    """The origin of a source's element at `index`: record `index % length` of epoch
    `index // length` (indices past the end are later epochs)."""
    if length <= 0:
        raise EndOfStream
    epoch, record = divmod(index, length)
    return [Origin(None, record, fields=(("epoch", epoch), *fields.items()))]


class Stream:
    """The elements of one `IterDataset`, read in order from its start, as far as asked."""

    def __init__(self, ds: Any, prepare: Callable[[Any], None] = lambda it: None) -> None:
        self._ds = ds
        self._prepare = prepare  # called with the iterator once made
        self._it: Iterator[Any] | None = None
        self._items: list[Any] = []
        self._ended = False

    def get(self, position: int) -> Any:
        """The element at `position`; `EndOfStream` if the stream ends before it."""
        while len(self._items) <= position:
            if self._ended:
                raise EndOfStream
            if self._it is None:
                self._it = iter(self._ds)
                self._prepare(self._it)
            try:
                self._items.append(next(self._it))
            except StopIteration:
                self._ended = True
                self.close()
        return self._items[position]

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if close is not None:
            close()


Changes = list[tuple[int, Any]]
"""Weights a mixture was given at run time, each with the position from which it holds."""

ByMixture = dict[int, Changes]
"""The changes of each mixture of a pipeline, by the identity of its node (`changes_by_mixture`)."""


class Tracer:
    """What a stage's `_origins` may ask for: its parents' elements (`stream(node)`: an
    `IterDataset`'s elements in order; `element(node, i)`: a `MapDataset`'s element), a
    memo that lives for one `provenance` call (`memo(stage)`), whether a parent has an
    element at a position (`exists`), and the weights a mixture was given at run time
    (`changes_of(mixture)`)."""

    def __init__(self, mix_changes: Changes | ByMixture | None = None) -> None:
        self.mix_changes = mix_changes
        """The weights the mixtures were given at run time: by mixture (`ByMixture`, from
        `changes_by_mixture`), or one list for the one mixture of the pipeline, or None."""
        self._streams: dict[int, Stream] = {}
        self._memos: dict[int, dict[str, Any]] = {}
        self._keep: list[Any] = []  # the nodes memoized by id, alive for the call
        self._open: list[Any] = []  # iterators to close with the call

    def changes_of(self, mixture: Any) -> Changes | None:
        """The weights `mixture` (a node of the pipeline) was given at run time, or None."""
        if isinstance(self.mix_changes, dict):
            return self.mix_changes.get(id(mixture)) or None
        return self.mix_changes or None

    def stream(self, node: Any) -> Stream:
        s = self._streams.get(id(node))
        if s is None:
            s = self._streams[id(node)] = Stream(node, lambda it: self._replay_changes(node, it))
            self._keep.append(node)
        return s

    def _replay_changes(self, node: Any, it: Any) -> None:
        """Has each mixture `it` (an iterator of `node`) reads through draw with the
        weights the run set on it."""
        if not self.mix_changes:
            return
        found = mixture_iterators(it, "schedule_weight_changes")
        if not isinstance(self.mix_changes, dict):
            for n in found:  # the pipeline's one mixture
                n.schedule_weight_changes(self.mix_changes)
            return
        nodes = mixtures(node)
        if len(nodes) != len(found):
            if any(self.mix_changes.get(id(m)) for m in nodes):
                raise _unaligned(node, len(found), len(nodes))
            return
        for m, n in zip(nodes, found):
            changes = self.mix_changes.get(id(m))
            if changes:
                n.schedule_weight_changes(changes)

    def element(self, node: Any, index: int) -> Any:
        import numpy as np

        return node._getitems(np.asarray([index], dtype=np.int64))[0]

    def memo(self, node: Any) -> dict[str, Any]:
        m = self._memos.get(id(node))
        if m is None:
            m = self._memos[id(node)] = {}
            self._keep.append(node)
        return m

    def exists(self, node: Any, position: int) -> bool:
        """Whether `node` has an element at `position` that is not filtered out."""
        try:
            return bool(records_of(node, position, self))
        except EndOfStream:
            return False

    def closing(self, it: Any) -> Any:
        """`it`, an iterator a stage made (a replay's), closed when the call ends."""
        self._open.append(it)
        return it

    def close(self) -> None:
        for s in self._streams.values():
            s.close()
        for it in self._open:
            close = getattr(it, "close", None)
            if close is not None:
                close()


def mixtures(node: Any) -> list[Any]:
    """The stages of `node`'s graph that draw with weights set at run time (they declare
    `_weights_set_at_run_time`), each occurrence, in the order `walk_iterators` meets
    their iterators: depth first, parents in order."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if getattr(n, "_weights_set_at_run_time", False):
            out.append(n)
        stack.extend(reversed(list(n.parents)))
    return out


def mixture_iterators(it: Any, method: str = "weight_changes") -> list[Any]:
    """The iterators below `it` (itself included) of mixtures whose weights can be set at
    run time (they have `method`), in the order `walk_iterators` meets them."""
    from chute._src.core.iterator import walk_iterators

    return [n for n in walk_iterators(it) if callable(getattr(type(n), method, None))]


def _unaligned(node: Any, iterators: int, nodes: int) -> ProvenanceError:
    return ProvenanceError(
        f"provenance: weights were set at run time on a mixture of {node!r}, but its "
        f"iterator reads {iterators} mixtures where the pipeline has {nodes} (a mixture "
        "computed in worker processes, or a stage that reads its parents other than as "
        "iterators of them): which mixture each change was made on cannot be told; set "
        "the weights of a mixture that runs in this process, above mp_prefetch."
    )


def changes_by_mixture(pipeline: Any, it: Any) -> ByMixture | None:
    """The weights each mixture of `pipeline` was given at run time (`set_weights` on its
    iterator), read from `it` (an iterator of `pipeline`, live or restored from a state):
    the mixtures' iterators are matched with their nodes in the order both are walked, so
    any number of mixtures is told apart (a mix of mixes, mixtures zipped or
    concatenated). None where no weights were set. `ProvenanceError` where a mixture's
    schedule forgot a change (its bound), or the iterators cannot be matched with nodes."""
    found = mixture_iterators(it)
    logs = [n.weight_changes() for n in found]
    if not any(changes or forgotten >= 0 for changes, forgotten in logs):
        return None
    for _, forgotten in logs:
        if forgotten >= 0:
            raise ProvenanceError(
                f"provenance: a mixture's weights were set at run time more often than its "
                f"schedule keeps (the change at draw {forgotten} was dropped), so its draws "
                "before the oldest change kept are not known; ask with a state saved earlier."
            )
    nodes = mixtures(pipeline)
    if len(nodes) != len(found):
        raise _unaligned(pipeline, len(found), len(nodes))
    out: ByMixture = {}
    for node, (changes, _) in zip(nodes, logs):
        if out.get(id(node), changes) != changes:
            raise ProvenanceError(
                f"provenance: the mixture {node!r} appears twice in the pipeline and its two "
                "iterators were given different weights at run time: the records of one "
                "node cannot follow two schedules; build a mixture per place."
            )
        out[id(node)] = changes
    return out


def length_of(node: Any, tracer: Tracer, beyond: int | None = None) -> int:
    """The number of elements of `node` (finite), found by asking whether it has an element
    at a position: O(log n) asks, each as costly as `node`'s own `_origins`. `beyond`: a
    position known to be past its end."""
    hi = beyond
    if hi is None:
        hi = 1
        while tracer.exists(node, hi - 1):
            hi *= 2
    lo = 0  # an element at lo - 1 (or lo == 0), none at hi
    while lo < hi:
        mid = (lo + hi) // 2
        if tracer.exists(node, mid):
            lo = mid + 1
        else:
            hi = mid
    return lo


def not_declared(node: Any) -> ProvenanceError:
    """The error for a stage that cannot say where its elements came from."""
    what = "an order-dependent stage"
    return ProvenanceError(
        f"provenance: the stage {node!r} ({type(node).__name__}, {what}) cannot say where "
        "its elements came from: declare `_origins(self, position, tracer)` on its class, "
        "returning a list of chute.experimental.Origin: for a source, "
        "Origin(None, record_index); for a stage, Origin(parent, parent_position, offset) "
        "for each part of its element at `position` (docs/extending.md, 'Saying where "
        "elements came from')."
    )


def default_origins(node: Any, position: int, tracer: Tracer) -> list[Origin]:
    """The default of `_origins` (`core/node.py`): element-wise stages and stages that hand
    on their input are transparent; a node without parents is a source whose element
    `position` is its record `position` (a `MapDataset` reads it as record
    `position % len` of epoch `position // len`; a stream is read up to it, to know that it
    is there); others must declare."""
    if role(node) in (StageRole.ELEMENT_WISE, StageRole.PREFETCH, StageRole.PASS_THROUGH):
        return same_position(position)
    if not node.parents:
        if hasattr(node, "_getitems"):  # random access: positions past the end are epochs
            return source_record(position, len(node))
        tracer.stream(node).get(position)  # EndOfStream past its end
        return [Origin(None, position)]
    raise not_declared(node)


def records_of(node: Any, position: int, tracer: Tracer) -> list[dict[str, Any]]:
    """The source records of `node`'s element at `position` (empty: filtered out), in the
    order of its parts, depth first."""
    out: list[dict[str, Any]] = []
    Path = tuple[tuple[Label, ...], tuple[int, ...], tuple[tuple[str, Any], ...]]
    # Each entry: a node and position to ask, or a record found (node None).
    stack: list[tuple[Any, Any, Path]] = [(node, position, ((), (), ()))]
    while stack:
        n, pos, (labels, offset, fields) = stack.pop()
        if n is None:
            out.append(pos)
            continue
        found: list[tuple[Any, Any, Path]] = []
        for o in origins(n, pos, tracer):
            label = labels if o.source is None else (*labels, o.source)
            if o.parent is None:
                found.append((None, _record(o, label, offset + o.offset, fields), ((), (), ())))
            else:
                path = (label, offset + o.offset, fields + o.fields)
                found.append((n.parents[o.parent], o.position, path))
        stack.extend(reversed(found))
    return out


def as_records(node: Any, position: int, tracer: Tracer) -> list[Origin]:
    """The records of `node`'s element at `position` as a source's origins (`parent`
    None, with their offsets, sources and fields): what a stage returns that reads a
    pipeline it does not declare as a parent (`ElasticIterator`)."""
    return [as_origin(r, tuple(r["offset"])) for r in records_of(node, position, tracer)]


def as_origin(record: dict[str, Any], offset: tuple[int, ...]) -> Origin:
    """A record found below a stage (`records_of`) as that stage's own origin, at `offset`
    in its element: what a stage returns that hands on part of its parent's element (the
    rows of a batch it splits), whose records it must pick and place itself."""
    fields = tuple((k, v) for k, v in record.items() if k not in ("source", "index", "offset"))
    return Origin(None, record["index"], offset, record["source"], fields)


def rows_of(node: Any, parts: Sequence[tuple[int, int, int]], tracer: Tracer) -> list[Origin]:
    """The records of rows `[lo, hi)` of `node`'s elements, for each `(position, lo, hi)`
    of `parts`, placed one part after another: a record at row `r` of its element (the
    first of its offset) is at row `rows before + r - lo`; a record without a row (the
    element is an array whose rows come from that one record) is in every part of its
    element, at the part's first row."""
    out: list[Origin] = []
    base = 0
    for position, lo, hi in parts:
        for r in records_of(node, position, tracer):
            offset = tuple(r["offset"])
            if not offset:
                out.append(as_origin(r, (base,)))
            elif lo <= offset[0] < hi:
                out.append(as_origin(r, (base + offset[0] - lo, *offset[1:])))
        base += hi - lo
    return out


def _record(
    o: Origin,
    labels: tuple[Label, ...],
    offset: tuple[int, ...],
    above: tuple[tuple[str, Any], ...],
) -> dict[str, Any]:
    """The record of a source's origin: its stages' fields under the source's own, the
    epochs of the stages that repeat a stream added to the source's."""
    source: Label
    if not labels:
        source = None
    elif len(labels) == 1:
        source = labels[0]
    else:
        source = "/".join(str(x) for x in labels)
    rec: dict[str, Any] = {"source": source, "index": o.position, "epoch": 0}
    passes = 0
    for key, value in above:
        if key == "epoch":
            passes += int(value)
        else:
            rec[key] = value
    rec.update(dict(o.fields))
    rec["epoch"] += passes
    rec["offset"] = offset
    return rec


def trace_steps(
    ds: Any,
    steps: Sequence[int],
    on_step: Callable[[int], None] | None = None,
    mix_changes: Changes | ByMixture | None = None,
) -> list[list[dict[str, Any]]]:
    """The records of each of `steps` of `ds` (an IterDataset); ProvenanceError past its end.
    `mix_changes`: the weights its mixtures were given at run time (`Tracer`; by mixture
    from `changes_by_mixture(ds, it)`)."""
    tracer = Tracer(mix_changes)
    try:
        out = []
        for k in steps:
            if on_step is not None:
                on_step(k)
            try:
                recs = records_of(ds, k, tracer)
            except EndOfStream as e:
                if e.args:
                    raise ProvenanceError(
                        f"provenance: step {k} of {ds!r} is never handed out: the run raises "
                        f"there ({e.args[0]}); ask for the steps before it."
                    ) from None
                raise ProvenanceError(
                    f"provenance: step {k} is beyond the end of {ds!r}: the stream ends "
                    f"before it; ask for steps below its length (a finite stream: "
                    "repeat it, ds.repeat(), for steps past one pass)."
                ) from None
            out.append(recs)
        return out
    finally:
        tracer.close()
