"""`experimental.WindowShuffleIterDataset`: a buffer shuffle for streams.

Reads `window_size` elements, hands them out in a keyed random order, reads the next
window. The state is where the window began upstream, the window's number (its key) and
how many of its elements were handed out; restoring re-reads the window, never storing it.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from chute._src.dataset import IterDataset
from chute._src.index_shuffle import IndexShuffle
from chute._src.iter.pack_common import (
    Mark,
    ReplayReader,
    check_mark,
    mark_state,
    replay_to_piece,
    restore_window_start,
)
from chute._src.iterator import MAX_POSITION, DatasetIterator, check_int
from chute._src.map.window_shuffle import SEED_TAG_WINDOW_SHUFFLE, check_window
from chute._src.seeding import derive_seed, seed_param, shown_seed

T = TypeVar("T")


class WindowShuffleIterDataset(IterDataset[T]):
    """Shuffles a stream within consecutive windows of `window_size` elements.

    >>> import chute
    >>> ds = chute.experimental.WindowShuffleIterDataset(
    ...     chute.MapDataset.range(8).to_iter_dataset(), window_size=4, seed=1)
    >>> out = list(ds)
    >>> sorted(out[:4]), sorted(out[4:])
    ([0, 1, 2, 3], [4, 5, 6, 7])
    """

    def __init__(self, parent: IterDataset[T], *, window_size: int, seed: int | None = None):
        super().__init__([parent])
        self._w = check_window(window_size, "WindowShuffleIterDataset")
        self._seed = self._op_seed(seed, SEED_TAG_WINDOW_SHUFFLE, "WindowShuffleIterDataset")
        self._seed_shown = shown_seed(seed, self._pipeline_seed)

    def make_iterator(self) -> DatasetIterator[T]:
        return _WindowShuffleIterator(self._parent_iter(), self._w, self._seed)

    def __repr__(self) -> str:
        return f"WindowShuffleIterDataset(window_size={self._w}, seed={self._seed_shown})"

    def _fingerprint_params(self) -> str:
        return f"window_size={self._w}, {seed_param(self._seed_shown, self._seed)}"


class _WindowShuffleIterator(DatasetIterator[T]):
    stage = "window_shuffle"

    def __init__(self, parent: DatasetIterator[T], window: int, seed: int) -> None:
        super().__init__(parent)
        self._size, self._seed = window, seed
        self._reader = ReplayReader(parent)
        self._buf: list[T] = []
        self._pos = 0
        self._window = 0  # number of the current window
        self._start: Mark | None = None

    def _fill(self) -> None:
        if self._buf:
            self._window += 1
        self._start = self._reader.mark()
        items: list[T] = []
        try:
            while len(items) < self._size:
                items.append(self._reader.next())
        except StopIteration:
            pass
        if not items:
            self._buf, self._pos = [], 0
            raise StopIteration
        order = IndexShuffle(len(items), derive_seed(self._seed, self._window))(
            np.arange(len(items), dtype=np.int64)
        )
        self._buf = [items[i] for i in order.tolist()]
        self._pos = 0

    def __next__(self) -> T:
        if self._pos >= len(self._buf):
            self._fill()
        x = self._buf[self._pos]
        self._pos += 1
        return x

    def _next_many(self, n: int) -> list[T]:
        out: list[T] = []
        try:
            while len(out) < n:
                if self._pos >= len(self._buf):
                    self._fill()
                take = self._buf[self._pos : self._pos + n - len(out)]
                out.extend(take)
                self._pos += len(take)
        except StopIteration:
            pass
        return out

    def get_state(self) -> dict[str, Any]:
        if self._start is None or self._pos >= len(self._buf):
            window = self._window + 1 if self._buf else self._window
            return mark_state(self.stage, self._reader.mark(), window=window)
        s = self._start
        return mark_state(self.stage, Mark(s.parent_state, s.skip, self._pos), window=self._window)

    def _restore(self, state: Any, path: str) -> None:
        w = self._size
        mark = check_mark(
            self,
            state,
            path,
            ("window",),
            w - 1,
            f"the elements of the open window already handed out: a window has "
            f"window_size={w}, and a finished one is recorded as the next, at 0",
        )
        window = check_int(state, "window", path, 0, MAX_POSITION // w)
        restore_window_start(self, mark, window, w, path)
        self._reader.seek(mark, path)
        self._buf, self._pos = [], 0
        self._window = window
        self._start = None
        if mark.piece:

            def refill() -> int:
                self._fill()
                return len(self._buf)

            replay_to_piece(mark, path, refill, "the window there has {n} elements")
            self._pos = mark.piece
