"""`MapDataset.random_map`.

`IterDataset.random_map`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.core import provenance
from chute._src.core.dataset import SEED_TAG_RANDOM_MAP, IterDataset, MapDataset
from chute._src.core.element_rngs import IndexRngs
from chute._src.core.element_spec import transform_output_spec
from chute._src.core.errors import add_stage_note
from chute._src.core.iterator import DatasetIterator
from chute._src.core.seeding import seed_param, shown_seed
from chute._src.core.transforms import as_random_map_fn, describe
from chute._src.ops.block_apply import failed_position
from chute._src.ops.map import IndexedIterator
from chute._src.ops.seed import grain_default_seed


def _draw_seed(ds: Any, seed: int | None) -> int:
    """The seed of the generators, as Grain's: the stage's own, or Grain's default from
    the seeds set upstream (the stage checked that there is one)."""
    if seed is not None:
        return int(seed)
    found = grain_default_seed(ds)
    assert found is not None  # `_op_seed` raised otherwise
    return found


class RandomMapMapDataset(MapDataset[Any]):
    """Applies `fn(element, rng)`; `rng` is Grain's for (seed, element index): a Philox
    generator seeded with the seed, its counter at the index (`IndexRngs`)."""

    def __init__(self, parent: MapDataset[Any], transform: Any, *, seed: int | None) -> None:
        super().__init__([parent])
        self._fn: Callable[[Any, np.random.Generator], Any] = as_random_map_fn(transform)
        self._seed = self._op_seed(seed, SEED_TAG_RANDOM_MAP, "random_map")
        self._seed_shown = shown_seed(seed, self._pipeline_seed)
        self._draws = _draw_seed(self, seed)

    def __len__(self) -> int:
        return len(self._parents[0])

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        xs = self._parents[0]._getitems(indices)
        fn = self._fn
        rngs = IndexRngs(self._draws)
        rng = rngs.rng
        it = iter(xs)
        try:
            return [
                None if x is None else fn(x, rng(key))
                for x, key in zip(it, rngs.for_indices(indices).tolist())
            ]
        except Exception as e:
            add_stage_note(e, self, int(indices[failed_position(it, len(xs))]))
            raise

    def __repr__(self) -> str:
        return f"RandomMapMapDataset(transform={describe(self._fn)}, seed={self._seed_shown})"

    def _fingerprint_params(self) -> str:
        return seed_param(self._seed_shown, self._seed)

    @property
    def _element_spec(self) -> Any:
        return transform_output_spec(self, self._fn)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        return provenance.same_position(position)  # element-wise: never run


class RandomMapIterDataset(IterDataset[Any]):
    """Applies `fn(element, rng)`; `rng` is Grain's for (seed, position in the stream)."""

    def __init__(self, parent: IterDataset[Any], transform: Any, *, seed: int | None) -> None:
        super().__init__([parent])
        self._fn: Callable[[Any, np.random.Generator], Any] = as_random_map_fn(transform)
        self._seed = self._op_seed(seed, SEED_TAG_RANDOM_MAP, "random_map")
        self._seed_shown = shown_seed(seed, self._pipeline_seed)
        self._draws = _draw_seed(self, seed)

    def _make_iterator(self) -> DatasetIterator[Any]:
        return IndexedIterator(self._parent_iter(), self, self._fn, IndexRngs(self._draws))

    def __repr__(self) -> str:
        return f"RandomMapIterDataset(transform={describe(self._fn)}, seed={self._seed_shown})"

    def _fingerprint_params(self) -> str:
        return seed_param(self._seed_shown, self._seed)

    @property
    def _element_spec(self) -> Any:
        return transform_output_spec(self, self._fn)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        return provenance.same_position(position)  # element-wise: never run
