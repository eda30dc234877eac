"""Saving and restoring iterator state: files, Orbax, torch (docs/checkpointing.md).

`save(path, it)`/`load(path, it)` write and read one JSON file, atomically.
`CheckpointHandler`, `CheckpointSave`, `CheckpointRestore` are Grain's Orbax handler and
its arguments; the two argument classes import Orbax when first used, never before.
Every iterator also has `state_dict()`/`load_state_dict()` (torch's `Stateful`).
"""

import importlib
import typing

from chute._src.checkpointing import load as load
from chute._src.checkpointing import save as save
from chute._src.orbax_handler import CheckpointHandler as CheckpointHandler

if typing.TYPE_CHECKING:
    from chute._src.orbax_args import CheckpointRestore as CheckpointRestore
    from chute._src.orbax_args import CheckpointSave as CheckpointSave

__all__ = ["CheckpointHandler", "CheckpointRestore", "CheckpointSave", "load", "save"]


def __getattr__(name: str) -> typing.Any:
    if name in ("CheckpointSave", "CheckpointRestore"):
        return getattr(importlib.import_module("chute._src.orbax_args"), name)
    raise AttributeError(f"module 'chute.checkpoint' has no attribute {name!r}")
