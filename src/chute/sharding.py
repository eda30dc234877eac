"""Sharding options for distributed training."""

from chute._src.sharding import NoSharding as NoSharding
from chute._src.sharding import ShardByJaxProcess as ShardByJaxProcess
from chute._src.sharding import ShardOptions as ShardOptions
from chute._src.sharding import shard_by_jax_process as shard_by_jax_process

__all__ = ["NoSharding", "ShardByJaxProcess", "ShardOptions", "shard_by_jax_process"]
