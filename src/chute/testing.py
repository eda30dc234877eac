"""Helpers for testing pipelines and stages built on chute."""

from chute._src.core.checkpoint_check import (
    assert_equal_output_after_checkpoint as assert_equal_output_after_checkpoint,
)
from chute._src.core.checkpoint_check import assert_trees_equal as assert_trees_equal

__all__ = ["assert_equal_output_after_checkpoint", "assert_trees_equal"]
