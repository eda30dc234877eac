"""Online bin packing into `num_packing_bins` rows at a time (first-fit or best-fit).

As in Grain: sequences are placed, in stream order, into a batch of `num_packing_bins`
empty bins; the first sequence that fits no bin closes the batch, whose non-empty bins are
emitted as rows (optionally in a shuffled order), and starts the next batch. Features not
in `length_struct` or `meta_features` are dropped.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core import provenance_replay as replay
from chute._src.core.columns import Columns
from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import MAX_POSITION, DatasetIterator, bad_value, check_int
from chute._src.core.seeding import derive_seed
from chute._src.ops.packing.common import (
    Mark,
    PackSpec,
    Placements,
    ReplayReader,
    assemble,
    check_mark,
    check_num_bins,
    mark_state,
    replay_error,
    restore_parent,
    split_pieces,
    upstream_count,
)

SEED_TAG_PACK = 5


class PackIterDataset(IterDataset[dict[str, Any]]):
    """The packing stage; `FirstFitPackIterDataset` and `BestFitPackIterDataset` pick the rule."""

    _first_fit = True
    _name = "FirstFitPackIterDataset"

    def __init__(
        self,
        parent: IterDataset[Any],
        *,
        length_struct: Any,
        num_packing_bins: int,
        seed: int | None = None,
        shuffle_bins: bool = True,
        shuffle_bins_group_by_feature: str | None = None,
        meta_features: Sequence[str] = (),
        pack_alignment_struct: Any = None,
        padding_struct: Any = None,
        max_sequences_per_bin: int | None = None,
        split_long_sequences: bool = False,
    ) -> None:
        super().__init__([parent])
        where = self._name
        self._spec = PackSpec(
            where,
            length_struct,
            meta_features,
            padding_struct,
            pack_alignment_struct,
            allow_nested=True,
        )
        self._bins = check_num_bins(num_packing_bins, where)
        if max_sequences_per_bin is not None and (
            isinstance(max_sequences_per_bin, bool)
            or not isinstance(max_sequences_per_bin, int)
            or max_sequences_per_bin < 1
        ):
            raise ValueError(
                f"{where}: max_sequences_per_bin={max_sequences_per_bin!r} is invalid: it "
                "must be a positive int, or None for no limit. (In Grain's words: If "
                "specified, `max_sequences_per_bin` must be a positive integer, but got "
                f"{max_sequences_per_bin}.)"
            )
        self._max_seqs = max_sequences_per_bin
        self._shuffle = bool(shuffle_bins)
        self._group_by = shuffle_bins_group_by_feature
        self._split = bool(split_long_sequences)
        # Grain's default is seed=0; a pipeline seed (ds.seed(s)) is used when there is one.
        if seed is None and self._pipeline_seed is None:
            seed = 0
        self._seed = self._op_seed(seed, SEED_TAG_PACK, where)

    def _make_iterator(self) -> DatasetIterator[dict[str, Any]]:
        self._spec.check_nested()
        return _PackIterator(self._parent_iter(), self)

    def __repr__(self) -> str:
        return (
            f"{self._name}(length_struct={dict(zip(self._spec.keys, self._spec.caps))}, "
            f"num_packing_bins={self._bins}, shuffle_bins={self._shuffle})"
        )

    def _fingerprint_params(self) -> str:
        s = self._spec
        return (
            f"{s.keys}, {s.caps}, {sorted(s.meta)}, {s.pads}, {s.aligns}, {self._bins}, "
            f"{self._max_seqs}, {self._shuffle}, {self._group_by}, {self._split}, {self._seed}"
        )

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The sequences of row `position`, each with the token it starts at: this stage's
        rule run again on its parent's elements whose packed features hold their position
        (`core/provenance_replay.py`); the parent's elements are computed, nothing else."""
        return replay.packed_origins(self, self._spec, position, tracer)


class _PackIterator(DatasetIterator[dict[str, Any]]):
    """Packs a batch of bins, emits its rows; the state is where the batch began upstream."""

    stage = "pack"

    def __init__(self, parent: DatasetIterator[Any], ds: PackIterDataset) -> None:
        super().__init__(parent)
        self._ds = ds
        self._spec = ds._spec
        self._reader = ReplayReader(parent)
        # The current batch's rows, in emission order (as columns when they are arrays).
        self._rows: list[dict[str, Any]] | Columns = []
        self._emitted = 0  # rows of the current batch already handed out
        self._counter = 0  # rows handed out before the current batch (keys the shuffle)
        self._start: Mark | None = None  # where the current batch began upstream
        self._next_start: Mark | None = None  # where the next batch begins
        self._pending: list[list[np.ndarray]] | None = None  # pieces of the overflow element
        self._pending_element: Any = None
        self._pending_piece = 0
        self._seen = 0  # elements read, to name a bad one

    # -- emitting --------------------------------------------------------------------------

    def __next__(self) -> dict[str, Any]:
        if self._emitted >= len(self._rows):
            self._pack_batch()
        row = self._rows[self._emitted]
        self._emitted += 1
        if self._emitted == len(self._rows):
            self._counter += len(self._rows)
            self._start, self._rows, self._emitted = self._next_start, [], 0
        return row

    def _next_many(self, n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        try:
            while len(out) < n:
                if self._emitted >= len(self._rows):
                    self._pack_batch()
                take = self._rows[self._emitted : self._emitted + n - len(out)]
                out.extend(take)
                self._emitted += len(take)
                if self._emitted == len(self._rows):
                    self._counter += len(self._rows)
                    self._start, self._rows, self._emitted = self._next_start, [], 0
        except StopIteration:
            pass
        return out

    def _next_columns(self, n: int) -> list[dict[str, Any]] | Columns:
        # The rows of the batches of bins as columns while they are (a `batch` above joins
        # them); the position moves as in `_next_many`.
        pieces: list[Columns] = []
        got = 0
        try:
            while got < n:
                if self._emitted >= len(self._rows):
                    self._pack_batch()
                rows = self._rows
                if not isinstance(rows, Columns):
                    out: list[dict[str, Any]] = [x for piece in pieces for x in piece]
                    return out + self._next_many(n - got)
                take = min(n - got, len(rows) - self._emitted)
                pieces.append(rows.take(self._emitted, self._emitted + take))
                self._emitted += take
                got += take
                if self._emitted == len(rows):
                    self._counter += len(rows)
                    self._start, self._rows, self._emitted = self._next_start, [], 0
        except StopIteration:
            pass
        return Columns.join(pieces) if pieces else []

    # -- packing ---------------------------------------------------------------------------

    def _pieces(self, element: Any) -> list[list[np.ndarray]]:
        spec = self._spec
        feats = spec.features(element, self._seen)
        self._seen += 1
        if len(feats) == 1 and len(feats[0]) <= spec.caps[0]:  # the common case, quickly
            return [feats]
        lens = [len(x) for x in feats]
        if any(n > c for n, c in zip(lens, spec.caps)):
            if not self._ds._split:
                raise spec.too_long(self._seen - 1, lens)
            return split_pieces(feats, spec.caps)
        return [feats]

    def _pack_batch(self) -> None:
        """Packs the next batch of bins into `self._rows`; StopIteration at the end."""
        ds, spec = self._ds, self._spec
        nb, caps, aligns = ds._bins, spec.caps, spec.aligns
        nf = len(caps)
        reader = self._reader
        if self._start is None:
            self._start = reader.mark()
        free = np.array([[c] * nb for c in caps], dtype=np.int64)
        used = [[0] * nb for _ in caps]
        counts = [0] * nb
        max_seqs = ds._max_seqs or 0
        first_fit = ds._first_fit
        aligned = any(a > 1 for a in aligns)
        p = Placements(nf)
        bins, segments = p.bins, p.segments
        track_meta = bool(spec.nonseq_meta)
        single = nf == 1 and not aligned
        free0, used0, cap0 = free[0], used[0], caps[0]
        keys = [cap0 * nb + b for b in range(nb)]  # for single-feature best fit
        arrays0, offsets0, lengths0 = p.arrays[0], p.offsets[0], p.lengths[0]

        pieces = self._pending
        element = self._pending_element
        j = self._pending_piece
        self._pending = None
        overflow: Mark | None = None
        while True:
            if pieces is None or j >= len(pieces):
                try:
                    element = reader.next()
                except StopIteration:
                    break
                pieces = self._pieces(element)
                j = 0
            feats = pieces[j]
            if single:
                x = feats[0]
                n = len(x)
                if first_fit:
                    fits = free0 >= n
                    b = int(fits.argmax())
                    if not fits[b]:
                        overflow = reader.last_mark(j)
                        break
                else:
                    # Bins sorted by (free space, index): the first with room is the best fit.
                    i = bisect_left(keys, n * nb)
                    if i == len(keys):
                        overflow = reader.last_mark(j)
                        break
                    b = keys.pop(i) % nb
                    if not (max_seqs and counts[b] + 1 >= max_seqs):
                        insort(keys, (cap0 - used0[b] - n) * nb + b)
                off = used0[b]
                used0[b] = off + n
                free0[b] = cap0 - off - n
                arrays0.append(x)
                offsets0.append(off)
                lengths0.append(n)
            else:
                lens = np.array([len(x) for x in feats], dtype=np.int64)
                fits_all = np.asarray((free >= lens[:, None]).all(0))
                if first_fit:
                    b = int(fits_all.argmax())
                else:
                    b = int(np.where(fits_all, free.sum(0), np.iinfo(np.int64).max).argmin())
                if not fits_all[b]:
                    overflow = reader.last_mark(j)
                    break
                for f in range(nf):
                    x = feats[f]
                    n = len(x)
                    off = used[f][b]
                    a = aligns[f]
                    end = -(-(off + n) // a) * a
                    used[f][b] = end
                    free[f, b] = caps[f] - end
                    p.arrays[f].append(x)
                    p.offsets[f].append(off)
                    p.lengths[f].append(n)
            count = counts[b] + 1
            counts[b] = count
            if max_seqs and count >= max_seqs:
                free[:, b] = -1
            bins.append(b)
            segments.append(count)
            if track_meta:
                p.metas.append((b, element))
            j += 1

        if overflow is not None:
            self._pending, self._pending_element, self._pending_piece = pieces, element, j
            self._next_start = overflow
        else:
            self._next_start = reader.mark()
        if not bins:
            raise StopIteration
        rows = sum(1 for c in counts if c)
        batch = assemble(spec, p, rows)
        order: list[int] = list(range(rows))
        if ds._shuffle:
            rng = np.random.default_rng(derive_seed(ds._seed, self._counter))
            order = rng.permutation(rows).tolist()
            if ds._group_by is not None:
                order = _group_rows(batch, ds._group_by, order, spec.where)
        names = list(batch)
        rows_as_columns = None
        if not spec.nested_features:  # rows of arrays only: as columns, which `batch` joins
            rows_as_columns = Columns.of_dict({k: batch[k][order] for k in names})
        if rows_as_columns is not None:
            self._rows = rows_as_columns
        else:
            self._rows = [spec.nest({k: batch[k][r] for k in names}) for r in order]

    # -- state -----------------------------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        start = self._start if self._start is not None else self._reader.mark()
        return mark_state(
            self.stage, start, self._reader, emitted=self._emitted, counter=self._counter
        )

    def _restore(self, state: Any, path: str) -> None:
        nb, split = self._ds._bins, self._ds._split
        mark = check_mark(
            self,
            state,
            path,
            ("emitted", "counter"),
            MAX_POSITION if split else 0,
            "the piece of a split element"
            if split
            else "this packer does not split elements (split_long_sequences=False)",
        )
        emitted = check_int(
            state,
            "emitted",
            path,
            0,
            nb - 1,
            f"rows of the open batch already handed out: a batch has at most "
            f"num_packing_bins={nb} rows, and a finished one is recorded as the next, at 0",
        )
        counter = check_int(state, "counter", path)
        restore_parent(self, mark, path)
        read = upstream_count(self, mark)
        if read is not None and not split and counter > read:
            raise bad_value(
                path,
                "counter",
                counter,
                f"it counts the rows handed out before the open batch, and each holds at "
                f"least one of the {read} elements read before it",
            )
        self._reader.seek(mark, path)
        self._rows, self._emitted, self._counter = [], 0, counter
        self._start, self._next_start = mark, None
        self._pending = None
        if mark.piece:
            try:
                element = self._reader.next()
            except StopIteration:
                raise replay_error(path, "piece", mark.piece, "the stream ends there") from None
            pieces = self._pieces(element)
            if mark.piece >= len(pieces):
                raise replay_error(
                    path, "piece", mark.piece, f"the element there splits into {len(pieces)} pieces"
                )
            self._pending, self._pending_element, self._pending_piece = (
                pieces,
                element,
                mark.piece,
            )
        if emitted:
            try:
                self._pack_batch()
            except StopIteration:
                raise replay_error(path, "emitted", emitted, "the stream ends there") from None
            if emitted >= len(self._rows):
                raise replay_error(
                    path, "emitted", emitted, f"the batch of bins there has {len(self._rows)} rows"
                )
            self._emitted = emitted
        self._reader.settle(path)


def _group_rows(batch: dict[str, Any], feature: str, perm: list[int], where: str) -> list[int]:
    """Grain's grouping: rows sorted by the mean of their distinct non-zero values of
    `feature`, the shuffle breaking ties (so rows of one group come out together)."""
    if feature not in batch:
        raise KeyError(
            f"{where}: shuffle_bins_group_by_feature={feature!r} is not a feature of the packed "
            f"rows {sorted(batch)}: name one of them (e.g. a packed meta feature)."
        )
    means = []
    for row in batch[feature]:
        distinct = np.unique(row)
        nonzero = np.count_nonzero(distinct)
        means.append(float(distinct.sum() / nonzero) if nonzero else 0.0)
    return sorted(range(len(perm)), key=lambda i: (means[i], perm[i]))
