"""`MapDataset.seed`: sets the pipeline seed that later random stages derive theirs from.

`IterDataset.seed`.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.core.seeding import validate_seed

T = TypeVar("T")


class SeedMapDataset(MapDataset[T]):
    """Passes elements through; only changes the seed its descendants inherit."""

    _role = StageRole.PASS_THROUGH

    def __init__(self, parent: MapDataset[T], seed: int) -> None:
        super().__init__([parent])
        self._pipeline_seed = validate_seed(seed, "seed")

    def __len__(self) -> int:
        return len(self._parents[0])

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        return self._parents[0]._getitems(indices)

    def __repr__(self) -> str:
        return f"SeedMapDataset(seed={self._pipeline_seed})"

    def _fingerprint_params(self) -> str:
        return f"seed={self._pipeline_seed}"


class SeedIterDataset(IterDataset[T]):
    """Passes elements through; only changes the seed its descendants inherit."""

    _role = StageRole.PASS_THROUGH

    def __init__(self, parent: IterDataset[T], seed: int) -> None:
        super().__init__([parent])
        self._pipeline_seed = validate_seed(seed, "seed")

    def _make_iterator(self) -> DatasetIterator[T]:
        return self._parent_iter()

    def __repr__(self) -> str:
        return f"SeedIterDataset(seed={self._pipeline_seed})"
