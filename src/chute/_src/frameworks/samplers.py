"""Samplers of the DataLoader API: which record to read at each step.

A sampler here is a recipe over record keys that the DataLoader applies to the source as
Dataset stages (shuffle, shard, repeat), so the DataLoader has no engine of its own.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from chute._src.core.element_rngs import ElementRngs
from chute._src.core.seeding import derive_seed, validate_seed
from chute._src.frameworks.sharding import NoSharding, ShardOptions, even_split_bounds

if TYPE_CHECKING:
    from chute._src.core.dataset import MapDataset


@dataclasses.dataclass
class RecordMetadata:
    """What a sampler says about step `index`: the record to read and its rng."""

    index: int
    record_key: int | None = None
    rng: np.random.Generator | None = None

    def __str__(self) -> str:
        # As Grain prints it (the samplers guide): `rng=Generator(Philox)`, not the repr's
        # `Generator(Philox) at 0x...`, so printed metadata compare across runs.
        return f"RecordMetadata(index={self.index}, record_key={self.record_key}, rng={self.rng})"

    def remove_record_key(self) -> RecordMetadata:
        """This metadata without its record key (what an operation's output carries)."""
        return self if self.record_key is None else dataclasses.replace(self, record_key=None)


class IndexSampler:
    """Record keys of `num_records` records: sharded, shuffled per epoch, repeated.

    As Grain's: a shard reads a contiguous range of the records (`even_split`: the first
    `num_records % shard_count` shards get one more, none with `drop_remainder`), shuffled
    within the shard. The sampler is indexed by the global step: step `i` is on shard
    `i % shard_count` and reads that shard's record `i // shard_count` (of its epochs, one
    after the other), so `len` is the global count and `sampler[2]` is valid on any shard.

    >>> s = IndexSampler(5, shuffle=True, seed=3, num_epochs=2)
    >>> len(s), sorted(s[i].record_key for i in range(5))
    (10, [0, 1, 2, 3, 4])
    """

    _seed_bits = 32  # Grain's IndexSampler takes 32-bit seeds

    def __init__(
        self,
        num_records: int,
        shard_options: ShardOptions | None = None,
        shuffle: bool = False,
        num_epochs: int | None = None,
        seed: int | None = None,
    ) -> None:
        if isinstance(num_records, bool) or not isinstance(num_records, int) or num_records <= 0:
            raise ValueError(
                f"IndexSampler: num_records={num_records!r} is invalid: it must be an int > 0; "
                "pass len(data_source)."
            )
        if num_epochs is not None and (
            isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs <= 0
        ):
            raise ValueError(
                f"IndexSampler: num_epochs={num_epochs!r} is invalid: it must be an int > 0, "
                "or None to repeat forever."
            )
        if shuffle and seed is None:
            raise ValueError(
                "IndexSampler: shuffle=True needs a seed: chute's shuffles are always seeded "
                "so that runs are reproducible; pass seed=42 (any int)."
            )
        if seed is not None:
            seed = validate_seed(seed, type(self).__name__, self._seed_bits)
        if shard_options is not None and not isinstance(shard_options, ShardOptions):
            raise TypeError(
                f"IndexSampler: shard_options={shard_options!r} is not a ShardOptions: pass "
                "chute.sharding.ShardOptions(shard_index, shard_count) or NoSharding()."
            )
        self._num_records = num_records
        self._shard_options = shard_options or NoSharding()
        self._shuffle = shuffle
        self._num_epochs = num_epochs
        self._seed = seed
        from chute._src.core.dataset import INFINITE, MapDataset

        self._keys = self._shard_order(MapDataset.range(num_records)).repeat()
        count = self._shard_options.shard_count
        if num_epochs is None:
            self._len = INFINITE
        else:
            self._len = num_epochs * num_records
            if self._shard_options.drop_remainder:
                self._len = min(self._len, num_records // count * count * num_epochs)
        self._rngs = ElementRngs(derive_seed(seed, 0)) if seed is not None else None

    @property
    def seed(self) -> int | None:
        return self._seed

    @property
    def shard_options(self) -> ShardOptions:
        return self._shard_options

    def apply(self, ds: MapDataset[Any]) -> MapDataset[Any]:
        """`ds` in this sampler's order, as Dataset stages: its first `num_records` records
        (all of them when `num_records=len(data_source)`; fewer, as Grain's sampler reads
        record keys below `num_records` only)."""
        if len(ds) < self._num_records:
            raise ValueError(
                f"{self!r} samples {self._num_records} records, but the data source has "
                f"only {len(ds)}: build the sampler with num_records=len(data_source) (or "
                "fewer, to read the first records only)."
            )
        if len(ds) > self._num_records:
            ds = ds[: self._num_records]
        ds = self._shard_order(ds)
        if self._num_epochs != 1:
            ds = ds.repeat(self._num_epochs)
        return ds

    def _shard_order(self, ds: MapDataset[Any]) -> MapDataset[Any]:
        """One epoch of this shard: its contiguous range, shuffled (Grain's order)."""
        if not isinstance(self._shard_options, NoSharding):
            start, end = even_split_bounds(self._num_records, self._shard_options)
            ds = ds[start:end]
        if self._shuffle:
            assert self._seed is not None
            ds = ds.shuffle(seed=self._seed)
        return ds

    def with_shard_options(self, shard_options: ShardOptions) -> IndexSampler:
        return IndexSampler(
            self._num_records, shard_options, self._shuffle, self._num_epochs, self._seed
        )

    def __len__(self) -> int:
        return self._len

    def _record_key(self, index: int) -> int:
        return int(self._keys[index // self._shard_options.shard_count])

    def __getitem__(self, index: int) -> RecordMetadata:
        if not 0 <= index < len(self):
            raise IndexError(
                f"{self!r}: index {index} is out of range: it must be in [0, {len(self)})."
            )
        rng = None
        if self._rngs is not None:
            key = int(self._rngs.for_indices(np.array([index]))[0])
            rng = self._rngs.rng(key)
        return RecordMetadata(index=index, record_key=self._record_key(index), rng=rng)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_records={self._num_records}, "
            f"shard_options={self._shard_options!r}, shuffle={self._shuffle}, "
            f"num_epochs={self._num_epochs}, seed={self._seed})"
        )


class SequentialSampler(IndexSampler):
    """Record keys in order, one epoch.

    As Grain's: step `i` reads record `i` (the sampler itself does not shard; `len` is
    `num_records`, less the remainder with `drop_remainder`), and a DataLoader on shard
    `s` of `c` reads steps `s, s + c, s + 2c, ...`: records dealt out in turn.
    """

    _seed_bits = 64  # Grain's SequentialSampler does not check its seed

    def __init__(
        self,
        num_records: int,
        shard_options: ShardOptions | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(num_records, shard_options, shuffle=False, num_epochs=1, seed=seed)

    def with_shard_options(self, shard_options: ShardOptions) -> SequentialSampler:
        return SequentialSampler(self._num_records, shard_options, self._seed)

    def _shard_order(self, ds: MapDataset[Any]) -> MapDataset[Any]:
        if isinstance(self._shard_options, NoSharding):
            return ds
        return ds[self._shard_options.shard_slice(self._num_records)]

    def _record_key(self, index: int) -> int:
        return index

    def __repr__(self) -> str:
        return (
            f"SequentialSampler(num_records={self._num_records}, "
            f"shard_options={self._shard_options!r}, seed={self._seed})"
        )
