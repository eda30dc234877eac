"""`IterDataset.bucket_by_sequence_length`: tf.data's length buckets, resumable.

As in tf.data, an element of length `n` goes to bucket `b` where
`bucket_boundaries[b-1] <= n < bucket_boundaries[b]` (the first bucket from 0, the last
without an upper bound), and a bucket that reaches its `bucket_batch_sizes[b]` elements is
handed out as a batch, in the order the buckets fill. Unlike tf.data, whose buckets stay
open for the whole stream (so a rare length can hold elements back indefinitely, and a
checkpoint would have to hold them), chute closes every bucket at the end of each window
of `window_size` elements: the partial batches of the window follow, in bucket order.
So no element moves outside its window, and the state is the window's start and the
batches handed out of it. `drop_remainder` drops the partial batches of the stream's last
window only (tf.data drops those at the end of the input).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.core.transforms import describe
from chute._src.ops.shaped_batches import (
    Padder,
    WindowBatchIterator,
    WindowBatchIterDataset,
    check_callable,
    element_lengths,
    positive_int,
)

WHERE = "bucket_by_sequence_length"


class BucketBySequenceLengthIterDataset(WindowBatchIterDataset):
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
        window = (
            16 * sum(sizes)
            if window_size is None
            else positive_int(window_size, "window_size", WHERE, "window_size=2048")
        )
        super().__init__(parent, window, Padder(batch_fn, pad_value))
        self._length_fn = element_length_func
        self._bounds = bounds
        self._sizes = sizes
        self._pad_to_boundary = bool(pad_to_bucket_boundary)
        self._drop = bool(drop_remainder)

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _BucketIterator(self._parent_iter(), self)

    def lengths(self, items: list[Any], first_index: int) -> np.ndarray:
        lengths = element_lengths(items, self._length_fn, WHERE, first_index)
        if self._pad_to_boundary and self._bounds:
            over = np.flatnonzero(lengths >= self._bounds[-1])
            if over.size:
                i = int(over[0])
                raise ValueError(
                    f"{WHERE}: input element {first_index + i} has length {int(lengths[i])} "
                    f">= the largest bucket boundary {self._bounds[-1]}: with "
                    "pad_to_bucket_boundary=True every element is padded to its bucket's "
                    "boundary - 1, so every length must be below the largest boundary; add a "
                    "boundary above it, or cut or drop such elements first."
                )
        return lengths

    def cut(
        self, lengths: np.ndarray, window: int, last: bool
    ) -> list[tuple[list[int], int | None]]:
        bucket = np.searchsorted(np.asarray(self._bounds, dtype=np.int64), lengths, side="right")
        open_: list[list[int]] = [[] for _ in self._sizes]
        out: list[tuple[list[int], int | None]] = []
        for i, b in enumerate(bucket.tolist()):
            open_[b].append(i)
            if len(open_[b]) == self._sizes[b]:
                out.append((open_[b], self._pad_length(b)))
                open_[b] = []
        if not (self._drop and last):
            out.extend((part, self._pad_length(b)) for b, part in enumerate(open_) if part)
        return out

    def _pad_length(self, bucket: int) -> int | None:
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
            f"drop_remainder={self._drop}, window_size={self._window}"
        )


class _BucketIterator(WindowBatchIterator):
    stage = "bucket_by_sequence_length"
