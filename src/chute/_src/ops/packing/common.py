"""What the packing stages share: the feature spec, a replayable reader, bin assembly.

Packing turns variable-length sequences into fixed-length rows. A packed row holds several
sequences (segments); for every packed feature `f` it carries `f_segment_ids` (1-based per
row, 0 in padding) and `f_positions` (0-based within each segment), both int32.

Two ideas keep it fast and its state small:

- **Place first, copy once.** Placing a sequence only records (bin, offset, segment id);
  the tokens of a whole batch of bins are copied with one fancy-index assignment per
  feature when the batch is complete, so no per-token Python runs, and per sequence there
  are a few list appends and one numpy comparison.
- **Replay, never store.** The state never holds buffered sequences or bins. It holds the
  upstream position where the current batch of bins began (the parent's state before a
  chunk of elements plus how many of that chunk to skip, and which piece of a split
  element) and how many rows were already emitted from it. Restoring re-reads from there
  and re-packs, which gives the same bins because packing is a pure function of the
  stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import (
    MAX_POSITION,
    DatasetIterator,
    bad_value,
    check_int,
    check_state,
)

CHUNK = 256  # at most this many elements read from the parent per call


@dataclass(frozen=True)
class Mark:
    """An upstream position: `parent_state`, then skip `skip` elements, then piece `piece`.

    `base` is how many elements the reader had read from its parent when the parent was
    at `parent_state` (in memory only, to count the read-ahead). A mark taken from a state
    also carries what the reader had read from there when the state was taken
    (`fetched`) and the size of its next read (`chunk`): `ReplayReader.seek` reads to
    exactly there again."""

    parent_state: dict[str, Any]
    skip: int
    piece: int = 0
    base: int = field(default=0, compare=False)
    fetched: int | None = field(default=None, compare=False)
    chunk: int | None = field(default=None, compare=False)

    def at_piece(self, piece: int) -> Mark:
        """This position, at piece `piece` of its element."""
        return replace(self, piece=piece)


class ReplayReader:
    """Reads a parent in chunks and can name the position of the last element it returned.

    `last_mark()` is the position of the element just returned (the parent's state before
    its chunk, and its offset in the chunk); `mark()` that of the next one. `seek(mark)`
    returns there after the parent has been restored to `mark.parent_state`.

    The reader reads ahead of what it returns (a chunk at a time), and a stage above may
    have changed something upstream meanwhile that is keyed by the upstream position (a
    mixture's weights are set at its draw position). So a state records how far the reader
    had read (`ahead`: `fetched` from the mark's parent state, and the next chunk's size),
    and a restore reads to exactly there again (`seek`, then `settle` once the stage has
    replayed): at every step after a restore the parent stands where it stood in the
    uninterrupted run. A reader whose parent has ended records a next chunk of 0, and one
    restored from such a state reads no further than the end was.
    """

    __slots__ = (
        "_after",
        "_base",
        "_buf",
        "_chunk",
        "_chunk_state",
        "_limit",
        "_max",
        "_parent",
        "_pending",
        "_pos",
        "_read",
        "_sought",
    )

    def __init__(self, parent: DatasetIterator[Any], max_chunk: int = CHUNK) -> None:
        self._parent = parent
        self._max = max(1, min(CHUNK, max_chunk))  # the largest read (`window_chunk`)
        self._buf: list[Any] = []
        self._pos = 0
        self._chunk_state: dict[str, Any] | None = None
        self._chunk = 1  # doubles to CHUNK: the first element is not computed far ahead
        self._sought = False  # positioned by seek() and nothing read since
        self._read = 0  # elements read from the parent (since the last seek)
        self._base = 0  # `_read` when the parent was at `_chunk_state`
        # While replaying after a seek: read no further than `_limit` (then take chunks of
        # `_after` again); and the elements `settle` read to reach it, with the parent's
        # state before them and their base, once the buffer is used up.
        self._limit: int | None = None
        self._after = 1
        self._pending: tuple[dict[str, Any], int, list[Any]] | None = None

    def _refill(self) -> None:
        self._sought = False
        if self._pending is not None:
            self._chunk_state, self._base, self._buf = self._pending
            self._pending, self._pos = None, 0
            return
        n = self._chunk
        if self._limit is not None:
            if self._read < self._limit:
                n = min(n, self._limit - self._read)
            else:  # past what was read when the state was taken: read as it read then
                self._limit, n = None, self._after
                self._chunk = n
        self._chunk_state = self._parent.get_state()
        self._base = self._read
        self._buf = self._parent._next_many(n)
        self._read += len(self._buf)
        # A short read is the parent's end: the reader asks no more (`_chunk` 0), so a state
        # taken after it restores to a reader that has ended too, even if something upstream
        # changed since (a mixture given new weights after it ran dry).
        self._chunk = min(self._max, n * 2) if len(self._buf) == n else 0
        self._pos = 0

    def next(self) -> Any:
        """The next element; StopIteration at the end."""
        pos = self._pos
        if pos >= len(self._buf):
            self._refill()
            pos = 0
            if not self._buf:
                raise StopIteration
        self._pos = pos + 1
        return self._buf[pos]

    def last_mark(self, piece: int = 0) -> Mark:
        assert self._chunk_state is not None and self._pos > 0
        return Mark(self._chunk_state, self._pos - 1, piece, self._base)

    def mark(self) -> Mark:
        if self._pos >= len(self._buf) and not self._sought and self._pending is not None:
            self._refill()  # on to the elements `settle` read ahead: nothing is read now
        if (self._pos >= len(self._buf) and not self._sought) or self._chunk_state is None:
            # Everything read was handed out: the parent is exactly at the next element.
            # (Right after seek() the mark restored is kept, so that get_state() after
            # set_state(s) gives s back.)
            self._buf, self._pos = [], 0
            self._chunk_state, self._base = self._parent.get_state(), self._read
        return Mark(self._chunk_state, self._pos, 0, self._base)

    def ahead(self, mark: Mark) -> dict[str, int]:
        """How far this reader has read, for a state at `mark` (a mark of this reader):
        the elements read from `mark.parent_state` on, and the size of its next read."""
        return {"fetched": self._read - mark.base, "chunk": self._next_chunk()}

    def _next_chunk(self) -> int:
        return self._after if self._limit is not None else self._chunk

    def seek(self, mark: Mark, path: str) -> None:
        """Positions at `mark`; the parent must just have been restored to its state.
        Where `mark` is from a state that records how far the reader had read, reads no
        further than that while the stage replays, and `settle()` reads the rest."""
        self._chunk_state = mark.parent_state
        self._sought = True
        self._pending = None
        self._buf = self._parent._next_many(mark.skip) if mark.skip else []
        self._read, self._base = len(self._buf), 0
        self._chunk = 1
        self._limit = mark.fetched
        self._after = mark.chunk if mark.chunk is not None else 1
        if len(self._buf) < mark.skip:
            raise CheckpointError(
                f"{path}['skip'] = {mark.skip} is past the end of the upstream stream "
                f"({len(self._buf)} elements remain): the state is from a different "
                "pipeline or data; restore a state taken by get_state() of this pipeline."
            )
        self._pos = mark.skip

    def settle(self, path: str) -> None:
        """After `seek` and the stage's replay: reads what the reader had read ahead when
        the state was taken and not yet again, so the parent stands where it stood then,
        and reads the next chunk as it would have. The reader never holds more than
        `CHUNK` elements read ahead: a state that says more is rejected (`path` names it)."""
        if self._limit is None:
            return
        rest = self._limit - self._read
        if rest > CHUNK:
            raise bad_value(
                path,
                "fetched",
                self._limit,
                f"the stage's reader holds at most {CHUNK} elements read ahead of the "
                f"stage's position, and this state says {rest}",
            )
        self._limit, self._chunk = None, self._after
        if rest > 0:
            state = self._parent.get_state()
            got = self._parent._next_many(rest)
            self._pending = (state, self._read, got) if got else None
            self._read += len(got)
            if len(got) < rest:  # the parent ended sooner than it did when the state was taken
                self._chunk = 0


def window_chunk(window: int | None) -> int:
    """The largest read of the reader under a stage that holds `window` elements (None: no
    bound): an eighth of the window, at most `CHUNK`. What the reader has read past the
    stage's window is what a change made upstream between steps (a mixture's new weights)
    waits behind on top of the window: at most `window / 8` elements, not `CHUNK`."""
    return CHUNK if window is None else max(1, min(CHUNK, window // 8))


def mark_state(stage: str, mark: Mark, reader: ReplayReader, **extra: int) -> dict[str, Any]:
    """The state of a replaying stage at `mark` (plus its own counters), with how far its
    `reader` has read ahead of `mark`."""
    return {
        "stage": stage,
        "skip": mark.skip,
        "piece": mark.piece,
        **reader.ahead(mark),
        **extra,
        "parent": mark.parent_state,
    }


AHEAD = ("fetched", "chunk")
"""The keys of a state that record how far the stage's reader had read (a state from
before they were recorded restores without them)."""


def check_mark(
    it: DatasetIterator[Any],
    state: Any,
    path: str,
    extra: Sequence[str] = (),
    max_piece: int = 0,
    piece_rule: str = "",
) -> Mark:
    """Checks a state from `mark_state` (its keys, `skip`, `piece` and how far the reader
    had read); changes nothing.

    `skip` is an offset in one chunk the reader took from the parent, so it is below
    `CHUNK`; `piece` is the stage's own (at most `max_piece`, for the reason `piece_rule`).
    """
    ahead = set(AHEAD) if not isinstance(state, dict) or "fetched" in state else set()
    check_state(state, it.stage, {"stage", "skip", "piece", "parent", *ahead, *extra}, path)
    skip = check_int(
        state,
        "skip",
        path,
        0,
        CHUNK - 1,
        f"an offset in one chunk of at most {CHUNK} elements read from the parent",
    )
    piece = check_int(state, "piece", path, 0, max_piece, piece_rule)
    if not ahead:
        return Mark(state["parent"], skip, piece)
    fetched = check_int(
        state, "fetched", path, skip, MAX_POSITION, "the reader read past the skipped elements"
    )
    chunk = check_int(
        state, "chunk", path, 0, CHUNK, "the size of the reader's next read (0: its parent ended)"
    )
    return Mark(state["parent"], skip, piece, 0, fetched, chunk)


def upstream_count(it: DatasetIterator[Any], mark: Mark) -> int | None:
    """How many elements the parent had handed out at `mark`, when its stage knows."""
    count = it._parent._count_at(mark.parent_state)
    return None if count is None else count + mark.skip


def restore_parent(it: DatasetIterator[Any], mark: Mark, path: str) -> None:
    it._parent._restore(mark.parent_state, f"{path}['parent']")


def restore_window_start(
    it: DatasetIterator[Any], mark: Mark, window: int, size: int, path: str
) -> None:
    """Restores `it`'s parent at `mark`, the start of window `window` of `size` elements,
    and checks, where the parent's stage can count, that the mark is there (or, between
    windows, the end of a short last window); raises `CheckpointError` naming "window"."""
    restore_parent(it, mark, path)
    read = upstream_count(it, mark)
    if read is None:
        return
    # Window k begins at element k * size; after the stream's last window the mark is its
    # end, which may fall short of the next window's start.
    if read == window * size or (not mark.piece and (window - 1) * size < read < window * size):
        return
    raise bad_value(
        path,
        "window",
        window,
        f"window {window} begins at element {window * size} of the stream "
        f"(window_size={size}), but the state's upstream position is element {read}",
    )


def replay_error(path: str, key: str, value: Any, what: str) -> CheckpointError:
    """The error for a state whose replay found less upstream than it records."""
    return bad_value(path, key, value, f"{what} (found when re-reading the stream there)")


def replay_to_piece(mark: Mark, path: str, refill: Callable[[], int], holds: str) -> None:
    """After `seek(mark)`, for a mark inside a group (`mark.piece` > 0): `refill()` reads the
    group the mark points into and returns its size, which must exceed `mark.piece`;
    `holds` names what the group holds in the error ("the window there has {n} elements")."""
    try:
        n = refill()
    except StopIteration:
        raise replay_error(path, "piece", mark.piece, "the stream ends there") from None
    if mark.piece >= n:
        raise replay_error(path, "piece", mark.piece, holds.format(n=n))


# -- the feature spec ------------------------------------------------------------------------


Key = str | tuple[str, ...]
"""A packed feature: its name, or the path to it inside a nested feature."""


class PackSpec:
    """Validated `length_struct`, `meta_features`, `padding_struct`, alignment.

    With `allow_nested` (the bin packers, as Grain's), a feature of `length_struct` may be
    a dict of lengths: its leaves are packed each by its own length, keyed by their path,
    and come out nested again (`nest`). Such a feature has no segment ids or positions, so
    it must be a meta feature (`check_nested`, when iterating, as Grain checks)."""

    def __init__(
        self,
        where: str,
        length_struct: Any,
        meta_features: Sequence[str] = (),
        padding_struct: Any = None,
        pack_alignment_struct: Any = None,
        *,
        allow_nested: bool = False,
    ) -> None:
        if not isinstance(length_struct, Mapping) or not length_struct:
            raise TypeError(
                f"{where}: length_struct={length_struct!r} is invalid: it must be a non-empty "
                'dict from feature name to row length, e.g. length_struct={"tokens": 128}.'
            )
        if isinstance(meta_features, str):
            raise TypeError(
                f"{where}: meta_features={meta_features!r} is a string: pass a list of "
                f"feature names, e.g. meta_features=[{meta_features!r}]."
            )
        self.where = where
        self.keys: list[Key] = []
        self.caps: list[int] = []
        self.nested_features: list[str] = []  # top-level features that are dicts

        def walk(node: Mapping[Any, Any], path: tuple[str, ...]) -> None:
            for k, v in node.items():
                if isinstance(k, str) and isinstance(v, Mapping) and allow_nested and v:
                    if not path:
                        self.nested_features.append(k)
                    walk(v, (*path, k))
                    continue
                if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(
                        f"{where}: length_struct{_show((*path, k))} = {v!r} is invalid: keys "
                        "must be feature names and lengths positive ints, e.g. "
                        '{"tokens": 128}.'
                    )
                self.keys.append((*path, k) if path else k)
                self.caps.append(int(v))

        walk(length_struct, ())
        self.meta: set[str] = set(meta_features)
        self.nonseq_meta: list[str] = [k for k in meta_features if k not in length_struct]
        self.pads: list[Any] = [_lookup(padding_struct, k, 0, "padding_struct") for k in self.keys]
        self.aligns: list[int] = [
            _lookup(pack_alignment_struct, k, 1, "pack_alignment_struct") for k in self.keys
        ]
        for k, a in zip(self.keys, self.aligns):
            if isinstance(a, bool) or not isinstance(a, int) or a < 1:
                raise ValueError(
                    f"{where}: pack_alignment_struct{_show(k)} = {a!r} is invalid: an "
                    "alignment must be a positive int (1 for none)."
                )

    def is_meta(self, key: Key) -> bool:
        """Whether `key` is packed without segment ids and positions."""
        return (key if isinstance(key, str) else key[0]) in self.meta

    def check_nested(self) -> None:
        """Raises for a nested feature that is not a meta feature (Grain's check)."""
        for k in self.nested_features:
            if k not in self.meta:
                raise ValueError(
                    f"{self.where}: feature {k!r} is a dict of features, which has no one "
                    "sequence to give segment ids and positions for: list it in "
                    f"meta_features=[{k!r}] to pack its features without them. (In Grain's "
                    f"words: Failed to extract segment ids for {k!r}, which has type "
                    "<class 'dict'> rather than np.ndarray. Perhaps it should be marked as a "
                    "meta feature?)"
                )

    def nest(self, row: dict[Any, Any]) -> dict[str, Any]:
        """`row` with the leaves of nested features (keyed by path) nested again."""
        if not self.nested_features:
            return row
        out: dict[str, Any] = {}
        for key, value in row.items():
            if isinstance(key, str):
                out[key] = value
                continue
            node = out
            for part in key[:-1]:
                node = node.setdefault(part, {})
            node[key[-1]] = value
        return out

    def features(self, element: Any, index: int) -> list[np.ndarray]:
        """The packed features of `element` as arrays with a sequence axis."""
        if type(element) is not dict and not isinstance(element, Mapping):  # (ABCs are slow)
            raise TypeError(
                f"{self.where}: element {index} is a {type(element).__name__}, not a dict: "
                "packing needs dict elements with the features named in length_struct; "
                'map them to dicts first, e.g. .map(lambda x: {"tokens": x}).'
            )
        out: list[np.ndarray] = []
        for k in self.keys:
            try:
                if isinstance(k, str):
                    x = element[k]
                else:
                    x = element
                    for part in k:
                        x = x[part]
            except (KeyError, TypeError, IndexError):
                raise KeyError(
                    f"{self.where}: element {index} has no feature {_feature(k)} (it has "
                    f"{sorted(element)}): every feature of length_struct must be present; "
                    "fix length_struct or the map that builds the elements."
                ) from None
            if type(x) is not np.ndarray or x.ndim == 0:
                x = np.atleast_1d(np.asarray(x))
            out.append(x)
        return out

    def too_long(self, index: int, lengths: Sequence[int]) -> ValueError:
        bad = {k: (n, c) for k, n, c in zip(self.keys, lengths, self.caps) if n > c}
        detail = ", ".join(f"{k!r} has {n} > {c}" for k, (n, c) in bad.items())
        return ValueError(
            f"{self.where}: element {index} is longer than a row ({detail}): a sequence "
            "must fit in a row; cut sequences before packing (e.g. .map(lambda x: x[:128])), "
            "or pass split_long_sequences=True to pack the overflow as further segments."
        )


def _feature(key: Key) -> str:
    """A feature as errors name it: `'tokens'`, or `['nested']['inner']`."""
    return repr(key) if isinstance(key, str) else _show(key)


def _show(key: Key | tuple[str, ...]) -> str:
    return f"[{key!r}]" if isinstance(key, str) else "".join(f"[{k!r}]" for k in key)


def _lookup(struct: Any, key: Key, default: Any, name: str) -> Any:
    if struct is None:
        return default
    if not isinstance(struct, Mapping):
        raise TypeError(f"{name}={struct!r} is invalid: it must be a dict keyed like length_struct")
    value: Any = struct
    for part in (key,) if isinstance(key, str) else key:
        value = value.get(part) if isinstance(value, Mapping) else None
    return default if value is None else value


def split_pieces(feats: list[np.ndarray], caps: list[int]) -> list[list[np.ndarray]]:
    """An over-long element cut into pieces that each fit a row (later pieces may be empty)."""
    n = max(-(-len(x) // c) for x, c in zip(feats, caps))
    return [[x[j * c : (j + 1) * c] for x, c in zip(feats, caps)] for j in range(n)]


# -- assembling bins -------------------------------------------------------------------------


class Placements:
    """Where the sequences of one batch of bins went: built by the packers, then assembled."""

    __slots__ = ("arrays", "bins", "lengths", "metas", "offsets", "segments")

    def __init__(self, num_features: int) -> None:
        self.bins: list[int] = []
        self.segments: list[int] = []
        self.arrays: list[list[np.ndarray]] = [[] for _ in range(num_features)]
        self.offsets: list[list[int]] = [[] for _ in range(num_features)]
        self.lengths: list[list[int]] = [[] for _ in range(num_features)]
        self.metas: list[tuple[int, Any]] = []  # (bin, element) for non-sequence meta features


def assemble(spec: PackSpec, p: Placements, rows: int) -> dict[Any, Any]:
    """The packed batch: every feature `(rows, length, ...)`, plus segment ids/positions."""
    bins = np.asarray(p.bins, dtype=np.int64)
    segs = np.asarray(p.segments, dtype=np.int32)
    out: dict[Any, Any] = {}  # keyed by feature name, or path in a nested feature
    aux: dict[str, np.ndarray] = {}
    for f, (key, cap, pad) in enumerate(zip(spec.keys, spec.caps, spec.pads)):
        arrays = p.arrays[f]
        first = arrays[0]
        lens = np.asarray(p.lengths[f], dtype=np.int64)
        total = int(lens.sum())
        starts = bins * cap + np.asarray(p.offsets[f], dtype=np.int64)
        # The flat destination of every token: its segment's start plus its rank in the
        # concatenation minus its segment's start there.
        before = np.cumsum(lens) - lens
        rank = np.arange(total, dtype=np.int64)
        dest = np.repeat(starts - before, lens) + rank
        values = np.full((rows * cap, *first.shape[1:]), pad, dtype=first.dtype)
        if total:
            try:
                values[dest] = np.concatenate(arrays)
            except ValueError as e:
                shapes = sorted({a.shape[1:] for a in arrays})
                raise ValueError(
                    f"{spec.where}: feature {key!r} has elements with different trailing "
                    f"shapes {shapes}: only the first (sequence) axis may vary; make the "
                    "other axes equal before packing."
                ) from e
        out[key] = values.reshape(rows, cap, *first.shape[1:])
        if not spec.is_meta(key):
            seg_ids = np.zeros(rows * cap, dtype=np.int32)
            positions = np.zeros(rows * cap, dtype=np.int32)
            seg_ids[dest] = np.repeat(segs, lens)
            positions[dest] = rank - np.repeat(before, lens)
            aux[f"{key}_segment_ids"] = seg_ids.reshape(rows, cap)
            aux[f"{key}_positions"] = positions.reshape(rows, cap)
    for key in spec.nonseq_meta:
        per_row: list[list[Any]] = [[] for _ in range(rows)]
        for b, element in p.metas:
            if key in element:
                per_row[b].append(element[key])
        column = np.empty(rows, dtype=object)
        for r, values_of_row in enumerate(per_row):
            column[r] = values_of_row
        out[key] = column
    out.update(aux)
    return out


def check_num_bins(num_packing_bins: Any, where: str) -> int:
    if (
        isinstance(num_packing_bins, bool)
        or not isinstance(num_packing_bins, int)
        or num_packing_bins < 1
    ):
        raise ValueError(
            f"{where}: num_packing_bins={num_packing_bins!r} is invalid: it must be a positive "
            "int (more bins fill rows better but mix more distant sequences), e.g. 30."
        )
    return num_packing_bins
