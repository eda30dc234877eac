"""`experimental.ConcatThenSplitIterDataset`: T5-style packing, no padding but at the end.

Elements are concatenated into a row until some feature is full; the element that does
not fit is split, its remainder starting the next row. Same semantics as Grain's,
including `split_full_length_features` and `BOSHandling`.

State: as Grain, a checkpoint is taken whenever no packed row is buffered: the upstream
position of the element the remainder comes from (or of the next element), whether there
is a remainder and where it starts in each feature (one int per feature, always, so the
state keeps its shape), and how many rows were emitted since. Restoring re-reads that
element and replays those rows.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from chute._src.core import provenance_replay as replay
from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import (
    MAX_POSITION,
    DatasetIterator,
    bad_value,
    check_int,
    check_state,
)
from chute._src.ops.packing.common import (
    AHEAD,
    CHUNK,
    Mark,
    PackSpec,
    ReplayReader,
    replay_error,
)


class BOSHandling(enum.Enum):
    """What `ConcatThenSplitIterDataset` does with beginning-of-sequence tokens."""

    DO_NOTHING = enum.auto()
    """Leave the tokens as they are."""
    REPLACE_FIRST_TOKEN_WITH_BOS = enum.auto()
    """Overwrite the first token of every segment (also a split remainder's) with BOS."""


class ConcatThenSplitIterDataset(IterDataset[dict[str, Any]]):
    """Concatenates sequences and splits them into rows of `length_struct` tokens.

    Every non-meta feature `f` gets `f_segment_ids` and `f_positions`. Meta features are
    never split (they are copied to both parts of a split element). With
    `split_full_length_features=False`, elements that already fill a row pass through.

    >>> import numpy as np, chute
    >>> from chute.experimental import BOSHandling, ConcatThenSplitIterDataset
    >>> seqs = [{"t": np.arange(1, n + 1)} for n in (3, 4, 2)]
    >>> ds = ConcatThenSplitIterDataset(chute.MapDataset.source(seqs).to_iter_dataset(),
    ...                                 length_struct={"t": 4})
    >>> [(r["t"].tolist(), r["t_segment_ids"].tolist()) for r in ds]
    [([1, 2, 3, 1], [1, 1, 1, 2]), ([2, 3, 4, 1], [1, 1, 1, 2]), ([2, 0, 0, 0], [1, 0, 0, 0])]
    >>> ds = ConcatThenSplitIterDataset(chute.MapDataset.source(seqs).to_iter_dataset(),
    ...     length_struct={"t": 4}, bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
    ...     bos_features=["t"], bos_token_id=9)
    >>> [r["t"].tolist() for r in ds]
    [[9, 2, 3, 9], [9, 3, 4, 9], [9, 0, 0, 0]]
    """

    def __init__(
        self,
        parent: IterDataset[Any],
        *,
        length_struct: Mapping[str, int],
        meta_features: Collection[str] = (),
        split_full_length_features: bool = True,
        bos_handling: BOSHandling = BOSHandling.DO_NOTHING,
        bos_features: Collection[str] = (),
        bos_token_id: int | None = None,
    ) -> None:
        super().__init__([parent])
        where = "ConcatThenSplitIterDataset"
        self._spec = PackSpec(where, length_struct, list(meta_features))
        if not isinstance(bos_handling, BOSHandling):
            raise TypeError(
                f"{where}: bos_handling={bos_handling!r} is invalid: pass a "
                "chute.experimental.BOSHandling member."
            )
        if bos_handling is BOSHandling.DO_NOTHING and (bos_token_id is not None or bos_features):
            raise ValueError(
                f"{where}: bos_token_id={bos_token_id!r} / bos_features={list(bos_features)} "
                "are set but bos_handling is DO_NOTHING: pass "
                "bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS, or drop them."
            )
        if bos_handling is not BOSHandling.DO_NOTHING and bos_token_id is None:
            raise ValueError(
                f"{where}: bos_handling={bos_handling.name} needs the BOS token: pass "
                "bos_token_id=... (e.g. your tokenizer's BOS id)."
            )
        overlap = set(bos_features) & set(meta_features)
        if overlap:
            raise ValueError(
                f"{where}: features {sorted(overlap)} are both bos_features and "
                "meta_features: BOS handling applies to packed features only; remove them "
                "from one of the two."
            )
        unknown = (set(bos_features) | set(meta_features)) - set(length_struct)
        if unknown:
            raise ValueError(
                f"{where}: features {sorted(unknown)} are not in length_struct "
                f"{dict(length_struct)}: meta and BOS features must be packed features; "
                "add their lengths to length_struct."
            )
        self._split_full = bool(split_full_length_features)
        self._bos = [
            bos_handling is not BOSHandling.DO_NOTHING and k in set(bos_features)
            for k in self._spec.keys
        ]
        self._bos_id = bos_token_id

    def _make_iterator(self) -> DatasetIterator[dict[str, Any]]:
        return _ConcatSplitIterator(self._parent_iter(), self)

    def __repr__(self) -> str:
        lengths = dict(zip(self._spec.keys, self._spec.caps))
        return f"ConcatThenSplitIterDataset(length_struct={lengths})"

    def _fingerprint_params(self) -> str:
        s = self._spec
        return (
            f"{s.keys}, {s.caps}, {sorted(s.meta)}, {self._split_full}, {self._bos}, {self._bos_id}"
        )

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The sequences of row `position`, each with the token it starts at: this stage's
        rule run again on its parent's elements whose packed features hold their position
        (`core/provenance_replay.py`); the parent's elements are computed, nothing else."""
        return replay.packed_origins(self, self._spec, position, tracer)


class _Piece:
    """A slice `[lo[f], hi[f])` of every feature of one upstream element."""

    __slots__ = ("feats", "hi", "lo", "mark")

    def __init__(self, mark: Mark, feats: list[np.ndarray], lo: list[int], hi: list[int]) -> None:
        self.mark, self.feats, self.lo, self.hi = mark, feats, lo, hi


class _ConcatSplitIterator(DatasetIterator[dict[str, Any]]):
    stage = "concat_then_split"

    def __init__(self, parent: DatasetIterator[Any], ds: ConcatThenSplitIterDataset) -> None:
        super().__init__(parent)
        self._ds = ds
        self._spec = ds._spec
        self._meta = [k in ds._spec.meta for k in ds._spec.keys]
        self._reader = ReplayReader(parent)
        self._out: deque[dict[str, Any]] = deque()
        self._remainder: _Piece | None = None
        self._stop = False
        self._ckpt: tuple[Mark, list[int] | None] | None = None
        self._since = 0  # rows emitted since the checkpoint
        self._seen = 0

    def _checkpoint(self) -> None:
        r = self._remainder
        self._ckpt = (self._reader.mark(), None) if r is None else (r.mark, list(r.lo))
        self._since = 0

    def __next__(self) -> dict[str, Any]:
        if self._out:
            self._since += 1
            return self._out.popleft()
        if self._stop:
            raise StopIteration
        self._checkpoint()
        spec = self._spec
        buffer: list[_Piece] = []
        tokens = [0] * len(spec.keys)
        while True:
            if self._remainder is not None:
                self._remainder = self._add(self._remainder, buffer, tokens)
                if self._remainder is not None:
                    break
            try:
                element = self._reader.next()
            except StopIteration:
                self._stop = True
                break
            piece = self._piece(element, self._reader.last_mark())
            if not self._ds._split_full and self._full_length(piece):
                self._out.append(self._pack([piece]))
                continue
            self._remainder = self._add(piece, buffer, tokens)
            if self._remainder is not None:
                break
        if buffer:
            self._out.appendleft(self._pack(buffer))
        if self._stop and self._remainder is not None:
            self._out.append(self._pack([self._remainder]))
            self._remainder = None
        if self._out:
            self._since += 1
            return self._out.popleft()
        self._checkpoint()
        raise StopIteration

    def _piece(self, element: Any, mark: Mark) -> _Piece:
        spec = self._spec
        if isinstance(element, Mapping) and set(element) != set(spec.keys):
            raise ValueError(
                f"ConcatThenSplitIterDataset: element {self._seen} has features "
                f"{sorted(element)} but length_struct has {sorted(spec.keys)}: every "
                "feature needs a length; add it to length_struct or drop it with a map. (In "
                f"Grain's words: Parent element has structure {sorted(element)} but "
                f"length_struct has {sorted(spec.keys)}.)"
            )
        feats = spec.features(element, self._seen)
        self._seen += 1
        for k, x, c, meta in zip(spec.keys, feats, spec.caps, self._meta):
            if meta and len(x) > c:
                raise ValueError(
                    f"ConcatThenSplitIterDataset: meta feature {k!r} of element "
                    f"{self._seen - 1} has length {len(x)} > {c}: meta features are never "
                    f"split, so they must fit a row; raise length_struct[{k!r}]."
                )
        return _Piece(mark, feats, [0] * len(feats), [len(x) for x in feats])

    def _full_length(self, piece: _Piece) -> bool:
        full = False
        for lo, hi, c in zip(piece.lo, piece.hi, self._spec.caps):
            n = hi - lo
            if n > c:
                return False
            full = full or n == c
        return full

    def _add(self, piece: _Piece, buffer: list[_Piece], tokens: list[int]) -> _Piece | None:
        """Adds what fits of `piece` to `buffer`; returns what is left (None if nothing)."""
        caps = self._spec.caps
        new = [0] * len(caps)
        points = list(piece.hi)
        split = False
        for f, meta in enumerate(self._meta):
            n = piece.hi[f] - piece.lo[f]
            avail = caps[f] - tokens[f]
            if n > avail:
                if meta:
                    return piece
                split = True
                points[f] = piece.lo[f] + avail
                new[f] = avail
            else:
                new[f] = n
        rest: _Piece | None = None
        if split:
            if all(p == 0 or m for p, m in zip(points, self._meta)):
                return piece
            left_hi = [h if m else p for p, h, m in zip(points, piece.hi, self._meta)]
            right_lo = [lo if m else p for p, lo, m in zip(points, piece.lo, self._meta)]
            rest = _Piece(piece.mark, piece.feats, right_lo, list(piece.hi))
            piece = _Piece(piece.mark, piece.feats, list(piece.lo), left_hi)
        buffer.append(piece)
        for f, n in enumerate(new):
            tokens[f] += n
        return rest

    def _pack(self, pieces: list[_Piece]) -> dict[str, Any]:
        spec, ds = self._spec, self._ds
        out: dict[Any, Any] = {}  # flat: this packer's features are names (no nesting)
        for f, (key, cap) in enumerate(zip(spec.keys, spec.caps)):
            first = pieces[0].feats[f]
            values = np.zeros((cap, *first.shape[1:]), dtype=first.dtype)
            seg = np.zeros(cap, dtype=np.int32)
            pos = np.zeros(cap, dtype=np.int32)
            end = 0
            for s, p in enumerate(pieces, 1):
                lo, hi = p.lo[f], p.hi[f]
                start, end = end, end + hi - lo
                values[start:end] = p.feats[f][lo:hi]
                if ds._bos[f] and end > start:
                    values[start] = ds._bos_id
                seg[start:end] = s
                pos[start:end] = np.arange(end - start, dtype=np.int32)
            out[key] = values
            if not self._meta[f]:
                out[f"{key}_segment_ids"] = seg
                out[f"{key}_positions"] = pos
        return out

    # -- state -----------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        if self._ckpt is None:
            self._checkpoint()
        assert self._ckpt is not None
        mark, remainder = self._ckpt
        return {
            "stage": self.stage,
            "skip": mark.skip,
            "has_remainder": remainder is not None,
            "remainder": [0] * len(self._spec.keys) if remainder is None else remainder,
            "emitted": self._since,
            **self._reader.ahead(mark),
            "parent": mark.parent_state,
        }

    def _restore(self, state: Any, path: str) -> None:
        keys = {"stage", "skip", "has_remainder", "remainder", "emitted", "parent"}
        if isinstance(state, dict) and "has_remainder" not in state:
            # An older state: `remainder` was [] when there was none.
            state = {**state, "has_remainder": state.get("remainder") != []}
            if state["remainder"] == []:
                state["remainder"] = [0] * len(self._spec.keys)
        if not isinstance(state, dict) or "fetched" in state:
            keys |= set(AHEAD)  # (an older state does not record how far the reader read)
        check_state(state, self.stage, keys, path)
        has_remainder = state["has_remainder"]
        if not isinstance(has_remainder, bool):
            raise bad_value(path, "has_remainder", has_remainder, "it must be true or false")
        skip = check_int(
            state,
            "skip",
            path,
            0,
            CHUNK - 1,
            f"an offset in one chunk of at most {CHUNK} elements read from the parent",
        )
        # One fill makes a row, plus the last remainder's at the end of the stream, plus
        # (without split_full_length_features) any full-length elements passed through.
        most = MAX_POSITION if not self._ds._split_full else 2
        emitted = check_int(
            state, "emitted", path, 0, most, "rows handed out from one fill of a row"
        )
        remainder = state["remainder"]
        nf = len(self._spec.keys)
        if not isinstance(remainder, list) or (
            (has_remainder or remainder)
            and (
                len(remainder) != nf
                or not all(
                    type(x) is int and 0 <= x <= MAX_POSITION and (x == 0 or not m)
                    for x, m in zip(remainder, self._meta)
                )
            )
        ):
            raise bad_value(
                path,
                "remainder",
                remainder,
                f"it must be {nf} non-negative ints, one per feature of length_struct "
                "(where the remainder starts; 0 for meta features, which are never split)",
            )
        if not has_remainder and any(remainder):
            raise bad_value(
                path, "remainder", remainder, "it must be all zeros when has_remainder is false"
            )
        self._parent._restore(state["parent"], f"{path}['parent']")
        mark = Mark(state["parent"], skip)
        if "fetched" in state:
            fetched = check_int(
                state, "fetched", path, skip, MAX_POSITION, "the reader read past 'skip'"
            )
            chunk = check_int(
                state,
                "chunk",
                path,
                0,
                CHUNK,
                "the size of the reader's next read (0: its parent ended)",
            )
            mark = Mark(state["parent"], skip, 0, 0, fetched, chunk)
        self._reader.seek(mark, path)
        self._out.clear()
        self._stop = False
        self._remainder = None
        if has_remainder:
            try:
                element = self._reader.next()
            except StopIteration:
                raise replay_error(path, "remainder", remainder, "the stream ends there") from None
            piece = self._piece(element, mark)
            # A split leaves some tokens of a split feature; an element that did not fit at
            # all is its remainder whole (all zeros).
            if any(lo > hi for lo, hi in zip(remainder, piece.hi)) or (
                any(remainder)
                and all(lo >= hi for lo, hi, m in zip(remainder, piece.hi, self._meta) if not m)
            ):
                raise replay_error(
                    path,
                    "remainder",
                    remainder,
                    f"a remainder starts inside the element there, whose features end at "
                    f"{piece.hi}",
                )
            piece.lo = [0 if m else lo for lo, m in zip(remainder, self._meta)]
            self._remainder = piece
        self._checkpoint()
        if emitted:
            try:
                next(self)
            except StopIteration:
                raise replay_error(path, "emitted", emitted, "the stream ends there") from None
            if emitted > 1 + len(self._out):
                raise replay_error(
                    path,
                    "emitted",
                    emitted,
                    f"the fill there makes {1 + len(self._out)} rows",
                )
            for _ in range(emitted - 1):
                self._out.popleft()
            self._since = emitted
        self._reader.settle(path)
