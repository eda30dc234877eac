"""`MapDataset.slice` / `ds[a:b:c]`: a strided view; `ds[k::n]` is shard k of n."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from chute._src.core import provenance
from chute._src.core.dataset import INFINITE, MapDataset

T = TypeVar("T")


class NotASliceError(TypeError, ValueError):
    """`MapDataset.slice` given something that is not a slice: a value of the wrong type
    (`TypeError`), and Grain's `ValueError`."""


class SliceMapDataset(MapDataset[T]):
    """Element `j` of epoch `e` is parent element `start + j * step` of epoch `e`."""

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, parent: MapDataset[T], sl: slice) -> None:
        super().__init__([parent])
        if not isinstance(sl, slice):
            raise NotASliceError(
                f"slice got {sl!r} of type {type(sl).__name__}: pass a slice object, "
                "e.g. ds.slice(slice(0, 100)) or ds[0:100]. (In Grain's words: sl is not a "
                f"slice: {type(sl)})"
            )
        if sl.step == 0:
            raise ValueError(
                f"slice {sl} is invalid: the step must be non-zero; use ds[k::n] to take "
                "every n-th element starting at k."
            )
        self._parent_len = len(parent)
        r = range(self._parent_len)[sl]
        self._start, self._step, self._len = r.start, r.step, len(r)
        self._stop = r.stop

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        n = self._len
        if n == 0:
            raise IndexError(f"{self!r} is empty: there is no element {int(indices[0])} to read")
        if self._parent_len >= INFINITE or not indices.size or int(indices.max()) < n:
            parent_idx = indices * self._step + self._start
        else:
            epochs, pos = np.divmod(indices, n)
            parent_idx = epochs * self._parent_len + pos * self._step + self._start
        return self._parents[0]._getitems(parent_idx)

    def __repr__(self) -> str:
        return f"SliceMapDataset[{self._start}:{self._stop}:{self._step}]"

    def _fingerprint_params(self) -> str:
        return f"{self._start}:{self._stop}:{self._step}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's position, as read."""
        if self._len == 0:
            raise provenance.EndOfStream
        if self._parent_len >= INFINITE or position < self._len:
            return provenance.same_position(position * self._step + self._start)
        epoch, pos = divmod(position, self._len)
        return provenance.same_position(epoch * self._parent_len + pos * self._step + self._start)
