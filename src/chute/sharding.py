"""Sharding options for distributed training."""

from chute._src.frameworks.sharding import NoSharding as NoSharding
from chute._src.frameworks.sharding import ShardByJaxProcess as ShardByJaxProcess
from chute._src.frameworks.sharding import ShardOptions as ShardOptions
from chute._src.frameworks.sharding import shard_by_jax_process as shard_by_jax_process

__all__ = ["NoSharding", "ShardByJaxProcess", "ShardOptions", "shard_by_jax_process"]
