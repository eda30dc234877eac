"""`MapDataset.seed`: sets the pipeline seed that later random stages derive theirs from.

`IterDataset.seed`.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from chute._src.core import contract
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator
from chute._src.core.seeding import validate_seed

T = TypeVar("T")


class SeedMapDataset(MapDataset[T]):
    """Passes elements through; only changes the seed its descendants inherit."""

    _role = StageRole.PASS_THROUGH
    _sets_seed = True

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
    _sets_seed = True

    def __init__(self, parent: IterDataset[T], seed: int) -> None:
        super().__init__([parent])
        self._pipeline_seed = validate_seed(seed, "seed")

    def _make_iterator(self) -> DatasetIterator[T]:
        return self._parent_iter()

    def __repr__(self) -> str:
        return f"SeedIterDataset(seed={self._pipeline_seed})"


def grain_default_seed(ds: MapDataset[Any] | IterDataset[Any]) -> int | None:
    """The seed Grain gives a random stage without one of its own: the seeds set upstream
    (`ds.seed(s)`), each with its distance from `ds`, found breadth first without looking
    past a seed, hashed by numpy's `SeedSequence` (None: no seed upstream)."""
    # A stage being built again on other parents (`_with_parents`) keeps its seed: the
    # seeds upstream are those of the stage it replaces.
    ds = ds.__dict__.get("_rebuilt_from", ds)
    found: list[int] = []
    to_visit: list[tuple[Any, int]] = [(p, 1) for p in _user_parents(ds)]
    while to_visit:
        node, depth = to_visit.pop(0)
        if getattr(node, "_sets_seed", False):
            found += (node._pipeline_seed, depth)
        else:
            to_visit += [(p, depth + 1) for p in _user_parents(node)]
    if not found:
        return None
    return int(np.random.SeedSequence(found).generate_state(1, dtype=np.uint32)[0])


def _user_parents(node: Any) -> list[Any]:
    """`node`'s parents as the user built them: a stage chute inserted (a timing wrapper,
    a stand-in for a stage moved into workers) is replaced by its own parents, so that
    it changes no distance."""
    out: list[Any] = []
    for p in node.parents:
        out += _user_parents(p) if contract.is_internal(p) else [p]
    return out
