"""`IterDataset.seed`."""

from __future__ import annotations

from typing import TypeVar

from chute._src.dataset import IterDataset
from chute._src.iterator import DatasetIterator
from chute._src.protocol import StageRole
from chute._src.seeding import validate_seed

T = TypeVar("T")


class SeedIterDataset(IterDataset[T]):
    """Passes elements through; only changes the seed its descendants inherit."""

    role = StageRole.PASS_THROUGH

    def __init__(self, parent: IterDataset[T], seed: int) -> None:
        super().__init__([parent])
        self._pipeline_seed = validate_seed(seed, "seed")

    def make_iterator(self) -> DatasetIterator[T]:
        return self._parent_iter()

    def __repr__(self) -> str:
        return f"SeedIterDataset(seed={self._pipeline_seed})"
