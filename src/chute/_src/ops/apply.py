"""`ds.apply(transformations)`: transform objects applied by their kind, in order."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, TypeVar, Union

from chute._src.core.transforms import (
    Batch,
    FilterTransform,
    MapTransform,
    MapWithIndex,
    RandomMapTransform,
)
from chute._src.ops.flat_map import FlatMapTransform

Transformation = Union[  # noqa: UP007 (a runtime alias, as Grain's)
    Batch, MapTransform, RandomMapTransform, FilterTransform, FlatMapTransform, MapWithIndex
]
Transformations = Sequence[Transformation]

D = TypeVar("D")


class Kind(enum.Enum):
    """What a transform does, which says the dataset method that applies it."""

    BATCH = "batch"
    MAP = "map"
    RANDOM_MAP = "random_map"
    MAP_WITH_INDEX = "map_with_index"
    FLAT_MAP = "flat_map"
    FILTER = "filter"


def transform_kind(t: Any) -> Kind | None:
    """The kind of transform `t` is, tested in Grain's order (an object of two kinds is
    the first: `Batch`, `MapTransform`, `RandomMapTransform`, `MapWithIndex`,
    `FlatMapTransform`, `FilterTransform`); None for anything else, which each caller
    names in its own error."""
    if isinstance(t, Batch):
        return Kind.BATCH
    if isinstance(t, MapTransform):
        return Kind.MAP
    if isinstance(t, RandomMapTransform):
        return Kind.RANDOM_MAP
    if isinstance(t, MapWithIndex):
        return Kind.MAP_WITH_INDEX
    if isinstance(t, FlatMapTransform):
        return Kind.FLAT_MAP
    if isinstance(t, FilterTransform):
        return Kind.FILTER
    return None


def apply_transform(ds: Any, t: Any, kind: Kind, *, seed: int | None = None) -> Any:
    """`t` applied to `ds` (a `MapDataset` or an `IterDataset`) as a transform of `kind`:
    the one dispatcher of `ds.apply` and the `DataLoader`'s operations. `seed` is the
    random map's (None: derived from the pipeline's seed, as `random_map`'s default)."""
    from chute._src.core.dataset import MapDataset

    match kind:
        case Kind.BATCH:
            return ds.batch(t.batch_size, drop_remainder=t.drop_remainder, batch_fn=t.batch_fn)
        case Kind.MAP:
            return ds.map(t)
        case Kind.RANDOM_MAP:
            return ds.random_map(t, seed=seed)
        case Kind.MAP_WITH_INDEX:
            return ds.map_with_index(t)
        case Kind.FLAT_MAP:
            from chute._src.ops.flat_map import FlatMapIterDataset, FlatMapMapDataset

            flat: Any = FlatMapMapDataset if isinstance(ds, MapDataset) else FlatMapIterDataset
            return flat(ds, t)
        case Kind.FILTER:
            return ds.filter(t)


def apply_transformations(ds: D, transformations: Any) -> D:
    """`ds` (a `MapDataset` or an `IterDataset`) with `transformations` (one or a
    sequence) applied in order, each as the method of its kind: `Batch` as `batch`,
    `MapTransform` as `map`, `RandomMapTransform` as `random_map`, `MapWithIndex` as
    `map_with_index`, `FlatMapTransform` as a flat map, `FilterTransform` as `filter`.

    >>> import chute
    >>> class AddOne(chute.transforms.Map):
    ...     def map(self, x):
    ...         return x + 1
    >>> ds = chute.MapDataset.range(5).apply([AddOne(), chute.transforms.Batch(2)])
    >>> [b.tolist() for b in ds]
    [[1, 2], [3, 4], [5]]
    """
    if not isinstance(transformations, Sequence):
        transformations = (transformations,)
    out: Any = ds
    for position, t in enumerate(transformations):
        kind = transform_kind(t)
        if kind is None:
            raise TypeError(
                f"apply: transformation {position}, {t!r} of type {type(t).__name__}, is not "
                "a transformation: use a Batch, MapTransform, RandomMapTransform, "
                "MapWithIndex, FlatMapTransform or FilterTransform (or call ds.map(fn) "
                "for a plain function)."
            )
        out = apply_transform(out, t, kind)
    return out
