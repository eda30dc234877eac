"""`ds.apply(transformations)`: transform objects applied by their kind, in order."""

from __future__ import annotations

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
    from chute._src.core.dataset import MapDataset

    if not isinstance(transformations, Sequence):
        transformations = (transformations,)
    out: Any = ds
    for position, t in enumerate(transformations):
        if isinstance(t, Batch):
            out = out.batch(t.batch_size, drop_remainder=t.drop_remainder, batch_fn=t.batch_fn)
        elif isinstance(t, MapTransform):
            out = out.map(t)
        elif isinstance(t, RandomMapTransform):
            out = out.random_map(t)
        elif isinstance(t, MapWithIndex):
            out = out.map_with_index(t)
        elif isinstance(t, FlatMapTransform):
            from chute._src.ops.flat_map import FlatMapIterDataset, FlatMapMapDataset

            flat: Any = FlatMapMapDataset if isinstance(out, MapDataset) else FlatMapIterDataset
            out = flat(out, t)
        elif isinstance(t, FilterTransform):
            out = out.filter(t)
        else:
            raise TypeError(
                f"apply: transformation {position}, {t!r} of type {type(t).__name__}, is not "
                "a transformation: use a Batch, MapTransform, RandomMapTransform, "
                "MapWithIndex, FlatMapTransform or FilterTransform (or call ds.map(fn) "
                "for a plain function)."
            )
    return out
