"""`IterDataset.bucket_by_sequence_length`: tf.data's length buckets, resumable.

As in tf.data, an element of length `n` goes to bucket `b` where
`bucket_boundaries[b-1] <= n < bucket_boundaries[b]` (the first bucket from 0, the last
without an upper bound), and a bucket that reaches its `bucket_batch_sizes[b]` elements is
handed out as a batch, in the order the buckets fill. The buckets stay open for the whole
stream: only at its end are the partial buckets handed out, in bucket order, and
`drop_remainder` drops them. So every batch before the end has its bucket's size (under
JAX, one shape per bucket, compiled once).

`window_size`, where given, bounds how long an element may wait: a bucket whose oldest
element was read `window_size` input elements ago is handed out as it is, short (and
dropped with `drop_remainder`). By default an element waits until its bucket fills.

The state never holds elements. Its size is fixed: the upstream position of the oldest
element still waiting in a bucket (the parent's state before its chunk and an offset, as
every replaying stage's: `packing/common.py`), how many input elements were read, and how
many elements wait in each bucket. A bucket always holds the most recent elements of its
lengths, so restoring re-reads the stream from that oldest element and keeps, for each
bucket, the last elements that belong to it. That re-read is as long as the oldest element
waited: where a bucket's lengths are rare, `window_size` bounds it.
"""

from __future__ import annotations

import bisect
import collections
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chute._src.core import provenance_replay as replay
from chute._src.core.dataset import IterDataset
from chute._src.core.errors import CheckpointError, add_stage_note
from chute._src.core.iterator import MAX_POSITION, DatasetIterator, bad_value, check_int
from chute._src.core.transforms import describe
from chute._src.ops.packing.common import (
    Mark,
    ReplayReader,
    check_mark,
    mark_state,
    replay_error,
    restore_parent,
    upstream_count,
    window_chunk,
)
from chute._src.ops.shaped_batches import Padder, check_callable, positive_int

WHERE = "bucket_by_sequence_length"


class BucketBySequenceLengthIterDataset(IterDataset[Any]):
    """Batches of elements of similar length, one batch size per length bucket.

    >>> import numpy as np, chute
    >>> ds = chute.MapDataset.range(1, 9).map(lambda n: np.full(n, n))
    >>> out = ds.to_iter_dataset().bucket_by_sequence_length(len, [4], [2, 3])
    >>> [b.shape for b in out]
    [(2, 2), (3, 6), (1, 3), (2, 8)]
    """

    def __init__(
        self,
        parent: IterDataset[Any],
        element_length_func: Callable[[Any], int],
        bucket_boundaries: Sequence[int],
        bucket_batch_sizes: Sequence[int],
        *,
        pad_to_bucket_boundary: bool = False,
        pad_value: Any = 0,
        batch_fn: Callable[[list[Any]], Any] | None = None,
        drop_remainder: bool = False,
        window_size: int | None = None,
    ) -> None:
        super().__init__([parent])
        if not isinstance(parent, IterDataset):
            raise TypeError(
                f"{WHERE}: parent {parent!r} is not an IterDataset: call .to_iter_dataset() "
                "on a MapDataset first."
            )
        check_callable(element_length_func, "element_length_func", WHERE, "len")
        bounds = [
            positive_int(b, "a bucket boundary", WHERE, "bucket_boundaries=[64, 128, 256]")
            for b in bucket_boundaries
        ]
        if any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(
                f"{WHERE}: bucket_boundaries={list(bucket_boundaries)!r} is invalid: the "
                "boundaries must increase strictly, e.g. [64, 128, 256]."
            )
        sizes = [
            positive_int(s, "a bucket batch size", WHERE, "bucket_batch_sizes=[64, 32, 16, 8]")
            for s in bucket_batch_sizes
        ]
        if len(sizes) != len(bounds) + 1:
            raise ValueError(
                f"{WHERE}: {len(sizes)} bucket_batch_sizes for {len(bounds)} "
                f"bucket_boundaries: n boundaries make n + 1 buckets, so give "
                f"{len(bounds) + 1} batch sizes (the last for lengths >= {bounds[-1:] or [0]})."
            )
        if pad_to_bucket_boundary and batch_fn is not None:
            raise ValueError(
                f"{WHERE}: pad_to_bucket_boundary=True and batch_fn= were both given: padding "
                "is a way of making the batch, so pass one of them."
            )
        self._max_wait = (
            None
            if window_size is None
            else positive_int(window_size, "window_size", WHERE, "window_size=2048")
        )
        self._padder = Padder(batch_fn, pad_value)
        self._length_fn = element_length_func
        self._bounds = bounds
        self._sizes = sizes
        self._pad_to_boundary = bool(pad_to_bucket_boundary)
        self._drop = bool(drop_remainder)

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _BucketIterator(self._parent_iter(), self)

    def bucket_of(self, element: Any, index: int) -> int:
        """The bucket of `element`, input element `index`; checks its length. (The
        iterator computes it inline for a length that passes the checks.)"""
        n = self._length_fn(element)
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ValueError(
                f"{WHERE}: element_length_func returned {n!r} for input element {index}: it "
                "must return a non-negative int, the element's length (e.g. "
                'element_length_func=lambda x: len(x["tokens"])).'
            )
        bounds = self._bounds
        if self._pad_to_boundary and bounds and n >= bounds[-1]:
            raise ValueError(
                f"{WHERE}: input element {index} has length {int(n)} >= the largest bucket "
                f"boundary {bounds[-1]}: with pad_to_bucket_boundary=True every element is "
                "padded to its bucket's boundary - 1, so every length must be below the "
                "largest boundary; add a boundary above it, or cut or drop such elements first."
            )
        return bisect.bisect_right(bounds, n)

    def pad_length(self, bucket: int) -> int | None:
        if not self._pad_to_boundary or not self._bounds:
            return None
        return self._bounds[bucket] - 1

    def __repr__(self) -> str:
        return (
            f"BucketBySequenceLengthIterDataset(bucket_boundaries={self._bounds}, "
            f"bucket_batch_sizes={self._sizes}, element_length_func="
            f"{describe(self._length_fn)}, {self._padder.describe()})"
        )

    def _fingerprint_params(self) -> str:
        return (
            f"bucket_boundaries={self._bounds}, bucket_batch_sizes={self._sizes}, "
            f"drop_remainder={self._drop}, window_size={self._max_wait}"
        )

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The elements of batch `position` with their rows (`replay.padded_origins`)."""
        return replay.padded_origins(self, position, tracer)


class _BucketIterator(DatasetIterator[Any]):
    """Open buckets of elements; each remembers where its oldest element was read."""

    stage = "bucket_by_sequence_length"

    def __init__(self, parent: DatasetIterator[Any], ds: BucketBySequenceLengthIterDataset):
        super().__init__(parent)
        self._ds = ds
        self._reader = ReplayReader(parent, window_chunk(ds._max_wait))
        self._buckets: list[list[Any]] = [[] for _ in ds._sizes]
        # For each open bucket, the input index and upstream position of its oldest element.
        self._firsts: list[tuple[int, Mark] | None] = [None for _ in ds._sizes]
        self._read = 0  # input elements read
        self._ended = False  # the input is exhausted: the open buckets are the remainder
        self._handed = 0  # batches handed out by this iterator (for error notes)

    def _oldest(self) -> tuple[int, Mark, int] | None:
        """The index and position of the oldest waiting element, and its bucket."""
        best: tuple[int, Mark, int] | None = None
        for b, first in enumerate(self._firsts):
            if first is not None and (best is None or first[0] < best[0]):
                best = (first[0], first[1], b)
        return best

    def _next_bucket(self) -> int:
        """Reads until a bucket is to be handed out and returns it; StopIteration at the end."""
        ds, buckets, sizes = self._ds, self._buckets, self._ds._sizes
        read_next, length_fn, bounds, wait = (
            self._reader.next,
            ds._length_fn,
            ds._bounds,
            ds._max_wait,
        )
        # Lengths at or above `limit` raise (`bucket_of`); the checks are its, done there.
        limit = bounds[-1] if ds._pad_to_boundary and bounds else None
        while True:
            if wait is not None:
                oldest = self._oldest()
                if oldest is not None and self._read - oldest[0] >= wait:
                    return oldest[2]
            if self._ended:
                rest = next((b for b, bucket in enumerate(buckets) if bucket), None)
                if rest is None:
                    raise StopIteration
                return rest
            try:
                x = read_next()
            except StopIteration:
                self._ended = True
                continue
            index = self._read
            self._read = index + 1
            n = length_fn(x)
            if type(n) is int and n >= 0 and (limit is None or n < limit):
                b = bisect.bisect_right(bounds, n)
            else:
                b = ds.bucket_of(x, index)
            bucket = buckets[b]
            if not bucket:
                self._firsts[b] = (index, self._reader.last_mark())
            bucket.append(x)
            if len(bucket) == sizes[b]:
                return b

    def __next__(self) -> Any:
        ds = self._ds
        while True:
            b = self._next_bucket()
            elements = self._buckets[b]
            self._buckets[b], self._firsts[b] = [], None
            if len(elements) == ds._sizes[b] or not ds._drop:
                break
        try:
            batch = ds._padder(elements, ds.pad_length(b))
        except Exception as e:
            add_stage_note(e, ds, self._handed)
            raise
        self._handed += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        oldest = self._oldest()
        index, mark = (
            (self._read, self._reader.mark()) if oldest is None else (oldest[0], oldest[1])
        )
        state = mark_state(self.stage, mark, self._reader, read=self._read, oldest=index)
        state["waiting"] = [len(bucket) for bucket in self._buckets]
        if self.stage_params:
            state["params"] = self.stage_params
        return state

    def _restore(self, state: Any, path: str) -> None:
        ds = self._ds
        keys = ("read", "oldest", "waiting", *(("params",) if self.stage_params else ()))
        mark = check_mark(self, state, path, keys, 0, "this stage re-reads whole elements")
        if self.stage_params and state["params"] != self.stage_params:
            raise CheckpointError(
                f"{path}['params'] = {state['params']!r}, but this pipeline's {self.stage!r} "
                f"stage there has {self.stage_params!r}: the state was taken with other "
                "parameters, which cut the stream into other batches; rebuild the pipeline as "
                "it was when the state was taken."
            )
        read = check_int(state, "read", path, 0, MAX_POSITION)
        oldest = check_int(state, "oldest", path, 0, read, "the oldest waiting element was read")
        waiting = _check_waiting(state, path, ds._sizes)
        if (sum(waiting) == 0) != (oldest == read):
            rule = "an element waits from that index on, so none waits exactly when it is 'read'"
            raise bad_value(path, "oldest", oldest, rule)
        if ds._max_wait is not None and read - oldest > ds._max_wait:
            rule = f"with window_size={ds._max_wait} no element waits longer, 'read' is {read}"
            raise bad_value(path, "oldest", oldest, rule)
        restore_parent(self, mark, path)
        at = upstream_count(self, mark)
        if at is not None and at != oldest:
            rule = f"the state's upstream position is element {at} of the stream"
            raise bad_value(path, "oldest", oldest, rule)
        self._reader.seek(mark, path)
        self._buckets = [[] for _ in ds._sizes]
        self._firsts = [None for _ in ds._sizes]
        self._read, self._ended = read, False
        if read > oldest:
            self._replay(mark, oldest, read, waiting, path)
        self._reader.settle(path)

    def _replay(self, mark: Mark, oldest: int, read: int, waiting: list[int], path: str) -> None:
        """Re-reads input elements `oldest` to `read` and keeps the last `waiting[b]` of
        each bucket `b`: the elements waiting when the state was taken."""
        ds = self._ds
        kept = [collections.deque[tuple[Any, int, Mark]](maxlen=k) for k in waiting]
        for index in range(oldest, read):
            try:
                x = self._reader.next()
            except StopIteration:
                what = f"the stream ends at element {index}"
                raise replay_error(path, "read", read, what) from None
            b = ds.bucket_of(x, index)
            if waiting[b]:
                kept[b].append((x, index, mark if index == oldest else self._reader.last_mark()))
        for b, k in enumerate(kept):
            if len(k) < waiting[b]:
                what = f"bucket {b} gets {len(k)} of elements {oldest} to {read - 1}"
                raise replay_error(path, "waiting", waiting, what)
            if k:
                self._buckets[b] = [x for x, _, _ in k]
                self._firsts[b] = (k[0][1], k[0][2])
        first = self._oldest()
        if first is None or first[0] != oldest:
            what = f"element {oldest} is not among the elements waiting in the buckets"
            raise replay_error(path, "oldest", oldest, what)


def _check_waiting(state: dict[str, Any], path: str, sizes: list[int]) -> list[int]:
    value = state["waiting"]
    if (
        not isinstance(value, list)
        or len(value) != len(sizes)
        or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k < s
            for k, s in zip(value, sizes)
        )
    ):
        raise CheckpointError(
            f"{path}['waiting'] = {value!r} is invalid: it must list, for each of the "
            f"{len(sizes)} buckets, how many elements wait in it, below its batch size "
            f"({sizes}); the state is corrupt or from a pipeline with other buckets; restore a "
            "state taken by get_state() of this pipeline."
        )
    return list(value)
