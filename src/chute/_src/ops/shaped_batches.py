"""What the batching stages shaped by the data share: windows, replay, padding.

`batch_by_tokens` reads its input in windows of `window_size` consecutive elements, cuts
each window into batches by the elements' lengths (a pure function of the window, its
number and whether it is the stream's last), and hands the batches out. No batch spans two
windows, so no element moves further than its window. (`bucket_by_sequence_length` shares
the padding and the checks, not the windows: its buckets stay open across the stream,
`bucket_by_length.py`.)

The state is the window's start upstream (the parent's state before a chunk, and an
offset in it), the window's number and how many of its batches were handed out: a few
integers plus the parent's state, whatever the window holds. Restoring re-reads the
window and cuts it again (`_src/ops/packing/common.py`: `ReplayReader`, `Mark`).

To know whether a window is the stream's last (where `drop_remainder` applies), the
iterator reads one element past a full window; that element opens the next window, whose
start is then the position of that element.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.core import provenance_replay as replay
from chute._src.core.dataset import IterDataset
from chute._src.core.errors import CheckpointError, add_stage_note
from chute._src.core.iterator import MAX_POSITION, DatasetIterator, check_int
from chute._src.core.transforms import describe
from chute._src.ops.packing.common import (
    Mark,
    ReplayReader,
    check_mark,
    mark_state,
    replay_to_piece,
    restore_window_start,
    window_chunk,
)
from chute._src.ops.pad_batch import PadStack

_NOTHING = object()


def positive_int(value: object, name: str, where: str, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(
            f"{where}: {name}={value!r} is invalid: it must be a positive int, e.g. {example}."
        )
    return int(value)


def optional_positive_int(value: object, name: str, where: str, example: str) -> int | None:
    return None if value is None else positive_int(value, name, where, example)


def check_callable(fn: object, name: str, where: str, example: str) -> None:
    if not callable(fn):
        raise TypeError(f"{where}: {name}={fn!r} is not callable: pass a function, e.g. {example}.")


def element_lengths(
    items: list[Any], length_fn: Callable[[Any], Any], where: str, first_index: int
) -> np.ndarray:
    """`length_fn(x)` for every element, checked to be non-negative ints."""
    out = np.empty(len(items), dtype=np.int64)
    for i, x in enumerate(items):
        n = length_fn(x)
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ValueError(
                f"{where}: length_fn returned {n!r} for input element {first_index + i}: it "
                "must return a non-negative int, the element's length (e.g. "
                'length_fn=lambda x: len(x["tokens"])).'
            )
        out[i] = n
    return out


def round_up(n: int, multiple: int | None) -> int:
    return n if not multiple else -(-n // multiple) * multiple


class Padder:
    """Makes a batch from its elements: the user's `batch_fn`, or padding and stacking
    (`PadStack`): ragged array leaves padded with `pad_value` to the longest in the batch,
    or, where the stage fixes a length, the first axis of every array leaf to it."""

    def __init__(self, batch_fn: Callable[[list[Any]], Any] | None, pad_value: Any) -> None:
        if batch_fn is not None:
            check_callable(batch_fn, "batch_fn", "batch", "batch_fn=my_collate")
        self.batch_fn = batch_fn
        self.pad_value = pad_value
        self._stack = PadStack(pad_value)

    def __call__(self, elements: list[Any], length: int | None) -> Any:
        if self.batch_fn is not None:
            return self.batch_fn(elements)
        if length is None:
            return self._stack(elements)
        return PadStack(self.pad_value, length)(elements)

    def describe(self) -> str:
        if self.batch_fn is not None:
            return f"batch_fn={describe(self.batch_fn)}"
        return f"pad_value={self.pad_value!r}"


class WindowBatchIterDataset(IterDataset[Any]):
    """A stage that cuts each window of its input into batches (`cut`) and makes them."""

    def __init__(self, parent: IterDataset[Any], window_size: int, padder: Padder) -> None:
        super().__init__([parent])
        if not isinstance(parent, IterDataset):
            raise TypeError(
                f"{type(self).__name__}: parent {parent!r} is not an IterDataset: call "
                ".to_iter_dataset() on a MapDataset first."
            )
        self._window = window_size
        self._padder = padder

    @abc.abstractmethod
    def cut(
        self, lengths: np.ndarray, window: int, last: bool
    ) -> list[tuple[list[int], int | None]]:
        """The batches of one window, in the order they are handed out: each the positions
        of its elements in the window and the length to pad them to (None: the longest).
        `last` is true for the stream's last window."""

    @abc.abstractmethod
    def lengths(self, items: list[Any], first_index: int) -> np.ndarray:
        """The lengths of a window's elements (`first_index`: the first one's input index)."""

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The elements of batch `position` with their rows (`replay.padded_origins`)."""
        return replay.padded_origins(self, position, tracer)


class WindowBatchIterator(DatasetIterator[Any]):
    """The iterator of a `WindowBatchIterDataset`; each stage subclasses it to name its
    `stage`."""

    def __init__(self, parent: DatasetIterator[Any], ds: WindowBatchIterDataset) -> None:
        super().__init__(parent)
        self._ds = ds
        self._size = ds._window
        self._reader = ReplayReader(parent, window_chunk(self._size))
        self._batches: list[tuple[list[Any], int | None]] = []
        self._pos = 0
        self._window = 0  # the number of the window in `_batches` (or of the next one)
        self._have = False  # whether `_batches` holds window `_window`
        self._start: Mark | None = None
        self._look: Any = _NOTHING  # the element read past a full window
        self._look_mark: Mark | None = None
        self._ended = False  # the window in `_batches` is the stream's last
        self._handed = 0  # batches handed out by this iterator (for error notes)

    def _fill(self) -> None:
        while True:
            if self._have:
                self._window += 1
                self._have = False
            if self._ended:
                self._batches, self._pos = [], 0
                raise StopIteration
            if self._look is not _NOTHING:
                assert self._look_mark is not None
                start, items = self._look_mark, [self._look]
                self._look, self._look_mark = _NOTHING, None
            else:
                start, items = self._reader.mark(), []
            try:
                while len(items) < self._size:
                    items.append(self._reader.next())
            except StopIteration:
                self._ended = True
            if not items:
                self._batches, self._pos = [], 0
                raise StopIteration
            if not self._ended:
                try:
                    self._look = self._reader.next()
                    self._look_mark = self._reader.last_mark()
                except StopIteration:
                    self._ended = True
            self._start = start
            self._have = True
            lengths = self._ds.lengths(items, self._window * self._size)
            cuts = self._ds.cut(lengths, self._window, self._ended)
            self._batches = [([items[i] for i in positions], pad) for positions, pad in cuts]
            self._pos = 0
            if self._batches:
                return

    def __next__(self) -> Any:
        if self._pos >= len(self._batches):
            self._fill()
        elements, pad = self._batches[self._pos]
        self._pos += 1
        try:
            batch = self._ds._padder(elements, pad)
        except Exception as e:
            add_stage_note(e, self._ds, self._handed)
            raise
        self._handed += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        if self._have and self._pos < len(self._batches):
            assert self._start is not None
            s = self._start
            return self._state(s.at_piece(self._pos), self._window)
        window = self._window + 1 if self._have else self._window
        mark = self._look_mark if self._look_mark is not None else self._reader.mark()
        return self._state(mark, window)

    def _state(self, mark: Mark, window: int) -> dict[str, Any]:
        state = mark_state(self.stage, mark, self._reader, window=window)
        if self.stage_params:
            state["params"] = self.stage_params
        return state

    def _restore(self, state: Any, path: str) -> None:
        w = self._size
        mark = check_mark(
            self,
            state,
            path,
            ("window", "params") if self.stage_params else ("window",),
            w - 1,
            f"the batches of the open window already handed out: a window of window_size={w} "
            "elements makes at most that many batches, and a finished one is recorded as the "
            "next, at 0",
        )
        if self.stage_params and state["params"] != self.stage_params:
            raise CheckpointError(
                f"{path}['params'] = {state['params']!r}, but this pipeline's {self.stage!r} "
                f"stage there has {self.stage_params!r}: the state was taken with other "
                "parameters, which cut the stream into other batches; rebuild the pipeline as "
                "it was when the state was taken."
            )
        window = check_int(state, "window", path, 0, MAX_POSITION // w)
        restore_window_start(self, mark, window, w, path)
        self._reader.seek(mark, path)
        self._batches, self._pos, self._have = [], 0, False
        self._look, self._look_mark, self._ended = _NOTHING, None, False
        self._window = window
        self._start = None
        if mark.piece:

            def refill() -> int:
                self._fill()
                return len(self._batches)

            replay_to_piece(mark, path, refill, "the window there makes {n} batches")
            self._pos = mark.piece
        self._reader.settle(path)


def too_long_error(where: str, index: int, length: int, padded: int, max_tokens: int) -> Exception:
    rounded = f" (padded to {padded})" if padded != length else ""
    return ValueError(
        f"{where}: input element {index} has length {length}{rounded} > max_tokens="
        f"{max_tokens}: even a batch of it alone breaks the budget, and nothing is cut "
        "silently; cut long elements first (e.g. .map(lambda x: x[:max_tokens])), drop them "
        "(.filter(lambda x: length_fn(x) <= max_tokens)), or raise max_tokens."
    )


def shuffled(batches: list[Any], seed: int | None, window: int) -> list[Any]:
    """`batches` in an order keyed by (seed, window), or as they are without a seed."""
    if seed is None or len(batches) < 2:
        return batches
    from chute._src.core.seeding import derive_seed
    from chute._src.ops.index_shuffle import IndexShuffle

    order = IndexShuffle(len(batches), derive_seed(seed, window))(
        np.arange(len(batches), dtype=np.int64)
    )
    return [batches[i] for i in order.tolist()]


def is_full(longest: int, count: int, max_tokens: int, max_batch_size: int | None) -> bool:
    """Whether one more element as long as `longest` would break the budget or the size."""
    return longest * (count + 1) > max_tokens or (
        max_batch_size is not None and count >= max_batch_size
    )
