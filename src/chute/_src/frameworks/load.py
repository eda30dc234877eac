"""`chute.load`: a `DataLoader` for a simple pipeline over a data source, in one call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chute._src.core.options import ReadOptions
from chute._src.core.transforms import Batch
from chute._src.frameworks.dataloader import DataLoader
from chute._src.frameworks.samplers import IndexSampler
from chute._src.frameworks.sharding import NoSharding, ShardOptions


def load(
    source: Any,
    *,
    num_epochs: int | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    shard_options: ShardOptions = NoSharding(),  # noqa: B008 (immutable, as Grain's)
    transformations: Sequence[Any] = (),
    batch_size: int | None = None,
    drop_remainder: bool = False,
    worker_count: int | None = 0,
    read_options: ReadOptions | None = None,
) -> DataLoader:
    """A `DataLoader` reading `source` through an `IndexSampler`, then `transformations`,
    then a `Batch(batch_size, drop_remainder)` when `batch_size` is given.

    >>> import chute
    >>> loader = chute.load(chute.sources.RangeDataSource(0, 5, 1), num_epochs=1, batch_size=2)
    >>> [b.tolist() for b in loader]
    [[0, 1], [2, 3], [4]]
    """
    sampler = IndexSampler(
        num_records=len(source),
        shard_options=shard_options,
        shuffle=shuffle,
        num_epochs=num_epochs,
        seed=seed,
    )
    operations = list(transformations)
    if batch_size is not None:
        operations.append(Batch(batch_size, drop_remainder=drop_remainder))
    return DataLoader(
        data_source=source,
        sampler=sampler,
        operations=operations,
        worker_count=worker_count,
        read_options=read_options,
    )
