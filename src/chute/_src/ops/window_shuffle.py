"""`experimental.WindowShuffleIterDataset`: a buffer shuffle for streams.

Reads `window_size` elements, hands them out in a keyed random order, reads the next
window. The state is where the window began upstream, the window's number (its key) and
how many of its elements were handed out; restoring re-reads the window, never storing it.

`experimental.WindowShuffleMapDataset`: a shuffle within windows of consecutive indices.

For data whose order matters at large scale (a curriculum, files read sequentially) or too
large for a global shuffle to be cheap to read: element `i` comes from the same window of
`window_size` consecutive indices, permuted by a keyed bijection. O(1) memory; epoch `e`'s
windows get their own permutations.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from chute._src.core import provenance
from chute._src.core import provenance_replay as replay
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.iterator import MAX_POSITION, DatasetIterator, check_int
from chute._src.core.seeding import derive_seed, seed_param, shown_seed
from chute._src.ops.index_shuffle import IndexShuffle
from chute._src.ops.packing.common import (
    Mark,
    ReplayReader,
    check_mark,
    mark_state,
    replay_to_piece,
    restore_window_start,
    window_chunk,
)

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

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, parent: IterDataset[T], *, window_size: int, seed: int | None = None):
        super().__init__([parent])
        self._w = check_window(window_size, "WindowShuffleIterDataset")
        self._seed = self._op_seed(seed, SEED_TAG_WINDOW_SHUFFLE, "WindowShuffleIterDataset")
        self._seed_shown = shown_seed(seed, self._pipeline_seed)

    def _make_iterator(self) -> DatasetIterator[T]:
        return _WindowShuffleIterator(self._parent_iter(), self._w, self._seed)

    def __repr__(self) -> str:
        return f"WindowShuffleIterDataset(window_size={self._w}, seed={self._seed_shown})"

    def _fingerprint_params(self) -> str:
        return f"window_size={self._w}, {seed_param(self._seed_shown, self._seed)}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's position: the window's shuffle run again on the parent's elements,
        each known by its identity (`core/provenance_replay.py`)."""
        return replay.reordered_origins(self, position, tracer)


class _WindowShuffleIterator(DatasetIterator[T]):
    stage = "window_shuffle"

    def __init__(self, parent: DatasetIterator[T], window: int, seed: int) -> None:
        super().__init__(parent)
        self._size, self._seed = window, seed
        self._reader = ReplayReader(parent, window_chunk(window))
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
            return mark_state(self.stage, self._reader.mark(), self._reader, window=window)
        s = self._start
        return mark_state(self.stage, s.at_piece(self._pos), self._reader, window=self._window)

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
        self._reader.settle(path)


SEED_TAG_WINDOW_SHUFFLE = 6


def check_window(window_size: object, where: str) -> int:
    if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise ValueError(
            f"{where}: window_size={window_size!r} is invalid: it must be a positive int (the "
            "number of consecutive elements shuffled together), e.g. 1000."
        )
    return window_size


class WindowShuffleMapDataset(MapDataset[T]):
    """Shuffles within windows of `window_size` consecutive elements.

    >>> import chute
    >>> ds = chute.experimental.WindowShuffleMapDataset(
    ...     chute.MapDataset.range(8), window_size=4, seed=1)
    >>> out = list(ds)
    >>> sorted(out[:4]), sorted(out[4:])
    ([0, 1, 2, 3], [4, 5, 6, 7])
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, parent: MapDataset[T], *, window_size: int, seed: int | None = None):
        super().__init__([parent])
        self._w = check_window(window_size, "WindowShuffleMapDataset")
        self._seed = self._op_seed(seed, SEED_TAG_WINDOW_SHUFFLE, "WindowShuffleMapDataset")
        self._seed_shown = shown_seed(seed, self._pipeline_seed)
        self._n = len(parent)
        self._perms: dict[tuple[int, int], IndexShuffle] = {}

    def __len__(self) -> int:
        return self._n

    def _perm(self, epoch: int, window: int, size: int) -> IndexShuffle:
        key = (epoch, window)
        perm = self._perms.get(key)
        if perm is None:
            if len(self._perms) >= 8:
                self._perms = {}
            perm = IndexShuffle(size, derive_seed(self._seed, epoch, window))
            self._perms[key] = perm
        return perm

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        n, w = self._n, self._w
        if n == 0:
            return self._parents[0]._getitems(indices)
        if n >= INFINITE:
            epochs, pos = np.zeros_like(indices), indices
        else:
            epochs, pos = np.divmod(indices, n)
        windows, within = np.divmod(pos, w)
        out_idx = np.empty_like(indices)
        keys = epochs * (n // w + 2) + windows if n < INFINITE else windows
        for k in np.unique(keys).tolist():
            sel = np.flatnonzero(keys == k)
            e, win = int(epochs[sel[0]]), int(windows[sel[0]])
            size = min(w, n - win * w) if n < INFINITE else w
            perm = self._perm(e, win, size)
            out_idx[sel] = perm(within[sel]) + win * w + e * n
        return self._parents[0]._getitems(out_idx)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_perms"] = {}
        return state

    def __repr__(self) -> str:
        return f"WindowShuffleMapDataset(window_size={self._w}, seed={self._seed_shown})"

    def _fingerprint_params(self) -> str:
        return f"window_size={self._w}, {seed_param(self._seed_shown, self._seed)}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's position, by the window's permutation, as read."""
        n, w = self._n, self._w
        if n == 0:
            return provenance.same_position(position)
        epoch, pos = (0, position) if n >= INFINITE else divmod(position, n)
        window, within = divmod(pos, w)
        size = min(w, n - window * w) if n < INFINITE else w
        moved = int(self._perm(epoch, window, size)(np.asarray([within], dtype=np.int64))[0])
        return provenance.same_position(moved + window * w + epoch * n)
