"""`experimental.WindowShuffleMapDataset`: a shuffle within windows of consecutive indices.

For data whose order matters at large scale (a curriculum, files read sequentially) or too
large for a global shuffle to be cheap to read: element `i` comes from the same window of
`window_size` consecutive indices, permuted by a keyed bijection. O(1) memory; epoch `e`'s
windows get their own permutations.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from chute._src.dataset import INFINITE, MapDataset
from chute._src.index_shuffle import IndexShuffle
from chute._src.seeding import derive_seed, seed_param, shown_seed

T = TypeVar("T")

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
