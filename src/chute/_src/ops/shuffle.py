"""`MapDataset.shuffle`: a global, per-epoch shuffle by a keyed bijection (O(1) memory)."""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import numpy as np

from chute._src.core import provenance
from chute._src.core.dataset import INFINITE, SEED_TAG_SHUFFLE, MapDataset
from chute._src.core.seeding import derive_seed, seed_param, shown_seed, validate_seed
from chute._src.ops.index_shuffle import IndexShuffle

T = TypeVar("T")


class ShuffleMapDataset(MapDataset[T]):
    """Position `i` of epoch `e` reads parent element `perm_e(i)` of epoch `e`.

    `perm_e` is keyed by `derive_seed(seed, e)`, so every epoch has its own order and the
    seeds of different epochs are unrelated. The repr and the state show the seed as the
    user gave it (`seeding.seed_param`).
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, parent: MapDataset[T], *, seed: int | None = None) -> None:
        super().__init__([parent])
        if len(parent) >= INFINITE:
            raise ValueError(
                f"shuffle of {parent!r}, which repeats forever, is invalid: a global shuffle "
                "needs a finite epoch; shuffle before repeat: ds.shuffle(seed).repeat()."
            )
        if seed is not None:  # Grain takes a 32-bit seed here (ds.seed(s) takes any)
            seed = validate_seed(seed, "shuffle", bits=32)
        self._seed = self._op_seed(seed, SEED_TAG_SHUFFLE, "shuffle")
        self._seed_shown = shown_seed(seed, self._pipeline_seed)
        self._n = len(parent)
        self._perms: dict[int, IndexShuffle] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def _perm(self, epoch: int) -> IndexShuffle:
        perm = self._perms.get(epoch)
        if perm is None:
            perm = IndexShuffle(self._n, derive_seed(self._seed, epoch))
            with self._lock:
                if len(self._perms) >= 4:
                    self._perms.clear()
                self._perms[epoch] = perm
        return perm

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        n = self._n
        if n == 0:
            return self._parents[0]._getitems(indices)
        epochs, pos = np.divmod(indices, n)
        first = int(epochs[0]) if epochs.size else 0
        if not epochs.size or bool((epochs == first).all()):
            parent_idx = self._perm(first)(pos) + first * n
        else:
            parent_idx = np.empty_like(indices)
            for e in np.unique(epochs).tolist():
                sel = epochs == e
                parent_idx[sel] = self._perm(e)(pos[sel]) + e * n
        return self._parents[0]._getitems(parent_idx)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_perms"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ShuffleMapDataset(seed={self._seed_shown})"

    def _fingerprint_params(self) -> str:
        return seed_param(self._seed_shown, self._seed)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's position: this epoch's permutation of the position, as read."""
        if self._n == 0:
            return provenance.same_position(position)
        epoch, pos = divmod(position, self._n)
        moved = int(self._perm(epoch)(np.asarray([pos], dtype=np.int64))[0])
        return provenance.same_position(moved + epoch * self._n)
