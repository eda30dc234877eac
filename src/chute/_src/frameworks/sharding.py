"""Which part of the data this process reads, for distributed training."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ShardOptions:
    """Shard `shard_index` of `shard_count`.

    As in Grain, an `IndexSampler` gives each shard a contiguous range of the records
    (`even_split_bounds`), shuffled within the shard; a `SequentialSampler` deals records
    out in turn (record `p` to shard `p % shard_count`). Either way each record of an
    epoch goes to exactly one shard. With `drop_remainder`, the `n % shard_count` records
    left over are dropped so that every shard gets the same number.
    """

    shard_index: int
    shard_count: int
    drop_remainder: bool = False

    def __post_init__(self) -> None:
        for name in ("shard_index", "shard_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"ShardOptions: {name}={value!r} is invalid: it must be an int.")
        if self.shard_count <= 0:
            raise ValueError(
                f"ShardOptions: shard_count={self.shard_count} is invalid: it must be > 0; "
                "use the number of processes reading the data, e.g. jax.process_count()."
            )
        if not 0 <= self.shard_index < self.shard_count:
            raise ValueError(
                f"ShardOptions: shard_index={self.shard_index} is invalid: it must be in "
                f"[0, shard_count={self.shard_count}); use this process's index, e.g. "
                "jax.process_index()."
            )

    def shard_slice(self, num_records: int) -> slice:
        """The positions of one epoch of `num_records` that this shard reads."""
        stop = num_records
        if self.drop_remainder:
            stop -= num_records % self.shard_count
        return slice(self.shard_index, stop, self.shard_count)


def even_split_bounds(num_records: int, options: ShardOptions) -> tuple[int, int]:
    """Grain's `even_split`: the contiguous range `[start, end)` of `num_records` that
    shard `options.shard_index` reads. Shards get `n // count` records, the first
    `n % count` one more (none with `drop_remainder`)."""
    per, extra = divmod(num_records, options.shard_count)
    start, end = per * options.shard_index, per * (options.shard_index + 1)
    if extra and not options.drop_remainder:
        start += min(options.shard_index, extra)
        end += min(options.shard_index + 1, extra)
    return start, end


class NoSharding(ShardOptions):
    """Every process reads all the data."""

    def __init__(self) -> None:
        super().__init__(shard_index=0, shard_count=1, drop_remainder=False)


class ShardByJaxProcess(ShardOptions):
    """Shard `jax.process_index()` of `jax.process_count()`."""

    def __init__(self, drop_remainder: bool = False) -> None:
        jax = import_jax("ShardByJaxProcess")
        super().__init__(
            shard_index=jax.process_index(),
            shard_count=jax.process_count(),
            drop_remainder=drop_remainder,
        )


def shard_by_jax_process(drop_remainder: bool = False) -> ShardOptions:
    """ShardOptions for this JAX process; `ValueError` outside a JAX distributed run.

    A script that also runs standalone catches the error and reads everything:

    >>> try:
    ...     shard_options = shard_by_jax_process()
    ... except ValueError:
    ...     shard_options = None
    """
    try:
        jax = import_jax("shard_by_jax_process")
    except ImportError as e:
        raise ValueError(str(e)) from e
    if not jax.distributed.is_initialized():
        raise ValueError(
            "shard_by_jax_process: this is not a JAX distributed run "
            "(jax.distributed.is_initialized() is False): call jax.distributed.initialize() "
            "first, or catch this ValueError and read all data in a standalone run."
        )
    return ShardByJaxProcess(drop_remainder=drop_remainder)


def import_jax(where: str) -> Any:
    """The `jax` module, or an ImportError naming `where` and the extra to install."""
    try:
        import jax
    except ImportError as e:
        raise ImportError(
            f"{where} needs JAX, which is not installed: pip install 'chute[jax]'."
        ) from e
    return jax
