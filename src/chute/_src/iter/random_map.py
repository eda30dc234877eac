"""`IterDataset.random_map`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.dataset import SEED_TAG_RANDOM_MAP, IterDataset
from chute._src.element_rngs import ElementRngs
from chute._src.iter.map import IndexedIterator
from chute._src.iterator import DatasetIterator
from chute._src.seeding import seed_param, shown_seed
from chute._src.transforms import as_random_map_fn, describe


class RandomMapIterDataset(IterDataset[Any]):
    def __init__(self, parent: IterDataset[Any], transform: Any, *, seed: int | None) -> None:
        super().__init__([parent])
        self._fn: Callable[[Any, np.random.Generator], Any] = as_random_map_fn(transform)
        self._seed = self._op_seed(seed, SEED_TAG_RANDOM_MAP, "random_map")
        self._seed_shown = shown_seed(seed, self._pipeline_seed)

    def make_iterator(self) -> DatasetIterator[Any]:
        return IndexedIterator(self._parent_iter(), self, self._fn, ElementRngs(self._seed))

    def __repr__(self) -> str:
        return f"RandomMapIterDataset(transform={describe(self._fn)}, seed={self._seed_shown})"

    def _fingerprint_params(self) -> str:
        return seed_param(self._seed_shown, self._seed)
