"""`IterDataset.batch_by_tokens`: batches whose padded size stays within a token budget.

The stream is read in windows of `window_size` consecutive elements. Each window is sorted
by length (stable; `sort=False` keeps the stream order) and cut greedily: an element joins
the open batch while `longest x count` (the longest rounded up to `pad_to_multiple_of`)
stays within `max_tokens` and the count within `max_batch_size`; otherwise it opens the
next batch. With a `seed`, the batches of each window are handed out in an order keyed by
(seed, window number); without one, shortest first. No batch spans two windows, so an
element is never moved outside its window, and every element of the stream appears in
exactly one batch (with `drop_remainder`, all but those of a dropped last batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.core.dataset import IterDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.core.seeding import validate_seed
from chute._src.core.transforms import describe
from chute._src.ops.shaped_batches import (
    Padder,
    WindowBatchIterator,
    WindowBatchIterDataset,
    check_callable,
    element_lengths,
    is_full,
    optional_positive_int,
    positive_int,
    shuffled,
    too_long_error,
)

WHERE = "batch_by_tokens"


class BatchByTokensIterDataset(WindowBatchIterDataset):
    """Batches of at most `max_tokens` padded tokens (`longest x count`).

    >>> import numpy as np, chute
    >>> ds = chute.MapDataset.range(1, 9).map(lambda n: np.ones(n, np.int32) * n)
    >>> batches = ds.to_iter_dataset().batch_by_tokens(12, length_fn=len, window_size=8)
    >>> [b.shape for b in batches]
    [(3, 3), (2, 5), (1, 6), (1, 7), (1, 8)]
    """

    def __init__(
        self,
        parent: IterDataset[Any],
        max_tokens: int,
        *,
        length_fn: Callable[[Any], int],
        max_batch_size: int | None = None,
        pad_to_multiple_of: int | None = None,
        drop_remainder: bool = False,
        window_size: int = 1000,
        sort: bool = True,
        seed: int | None = None,
        pad_value: Any = 0,
        batch_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        check_callable(length_fn, "length_fn", WHERE, 'length_fn=lambda x: len(x["tokens"])')
        super().__init__(
            parent,
            positive_int(window_size, "window_size", WHERE, "window_size=1000"),
            Padder(batch_fn, pad_value),
        )
        self._max_tokens = positive_int(max_tokens, "max_tokens", WHERE, "max_tokens=4096")
        self._max_batch = optional_positive_int(
            max_batch_size, "max_batch_size", WHERE, "max_batch_size=64"
        )
        self._multiple = optional_positive_int(
            pad_to_multiple_of, "pad_to_multiple_of", WHERE, "pad_to_multiple_of=8"
        )
        self._length_fn = length_fn
        self._drop = bool(drop_remainder)
        self._sort = bool(sort)
        self._seed = None if seed is None else validate_seed(seed, WHERE)

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _TokenBatchIterator(self._parent_iter(), self)

    def lengths(self, items: list[Any], first_index: int) -> np.ndarray:
        return element_lengths(items, self._length_fn, WHERE, first_index)

    def cut(
        self, lengths: np.ndarray, window: int, last: bool
    ) -> list[tuple[list[int], int | None]]:
        budget, cap, multiple = self._max_tokens, self._max_batch, self._multiple
        padded = lengths if not multiple else -(-lengths // multiple) * multiple
        over = np.flatnonzero(padded > budget)
        if over.size:
            i = int(over[0])
            raise too_long_error(
                WHERE, window * self._window + i, int(lengths[i]), int(padded[i]), budget
            )
        order = np.argsort(lengths, kind="stable") if self._sort else np.arange(len(lengths))
        batches: list[list[int]] = []
        longests: list[int] = []
        current: list[int] = []
        longest = 0
        for i, n in zip(order.tolist(), padded[order].tolist()):
            grown = max(longest, n)
            if current and (
                grown * (len(current) + 1) > budget or (cap is not None and len(current) >= cap)
            ):
                batches.append(current)
                longests.append(longest)
                current, grown = [], n
            current.append(i)
            longest = grown
        if current:
            batches.append(current)
            longests.append(longest)
        if self._drop and last and not is_full(longests[-1], len(batches[-1]), budget, cap):
            batches.pop()
            longests.pop()
        # With pad_to_multiple_of, `longest` is already rounded up: every batch is padded
        # to it; without, to the longest of each leaf.
        pad: list[int | None] = [n if multiple else None for n in longests]
        return shuffled(list(zip(batches, pad)), self._seed, window)

    def __repr__(self) -> str:
        return (
            f"BatchByTokensIterDataset(max_tokens={self._max_tokens}, length_fn="
            f"{describe(self._length_fn)}, {self._padder.describe()})"
        )

    def _fingerprint_params(self) -> str:
        return (
            f"max_tokens={self._max_tokens}, max_batch_size={self._max_batch}, "
            f"pad_to_multiple_of={self._multiple}, drop_remainder={self._drop}, "
            f"window_size={self._window}, sort={self._sort}, seed={self._seed}"
        )


class _TokenBatchIterator(WindowBatchIterator):
    stage = "batch_by_tokens"
