"""`MapDataset.repeat`: more epochs of the same elements (each shuffled anew upstream)."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from chute._src.dataset import INFINITE, MapDataset

T = TypeVar("T")


class RepeatMapDataset(MapDataset[T]):
    """Extends the index space; the parent reads index `i` as epoch `i // len(parent)`."""

    def __init__(self, parent: MapDataset[T], num_epochs: int | None = None) -> None:
        super().__init__([parent])
        if num_epochs is not None and (
            isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs <= 0
        ):
            raise ValueError(
                f"repeat num_epochs={num_epochs!r} is invalid: it must be a positive int, or "
                "None to repeat forever."
            )
        n = len(parent)
        if n >= INFINITE:  # as Grain
            raise ValueError(
                f"repeat of {parent!r}, which already repeats forever, does nothing: remove "
                "this repeat (or the one before)."
            )
        self._num_epochs = num_epochs
        if num_epochs is None:
            self._len = INFINITE if n > 0 else 0
        else:
            self._len = min(n * num_epochs, INFINITE)

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        return self._parents[0]._getitems(indices)

    def __repr__(self) -> str:
        return f"RepeatMapDataset(num_epochs={self._num_epochs})"

    def _fingerprint_params(self) -> str:
        return f"num_epochs={self._num_epochs}"
