"""Saving and restoring iterator state: files, Orbax, torch (docs/checkpointing.md).

`save(path, it)`/`load(path, it)` write and read one JSON file, atomically.
`CheckpointHandler`, `CheckpointSave`, `CheckpointRestore` are Grain's Orbax handler and
its arguments: the first use of any of the three imports Orbax and registers them
together, so every Orbax style works whatever is touched first.
Every iterator also has `state_dict()`/`load_state_dict()` (torch's `Stateful`).
"""

import typing

from chute._src.core.checkpointing import load as load
from chute._src.core.checkpointing import save as save

if typing.TYPE_CHECKING:
    from chute._src.frameworks.orbax_args import CheckpointHandler as CheckpointHandler
    from chute._src.frameworks.orbax_args import CheckpointRestore as CheckpointRestore
    from chute._src.frameworks.orbax_args import CheckpointSave as CheckpointSave

__all__ = ["CheckpointHandler", "CheckpointRestore", "CheckpointSave", "load", "save"]


def __getattr__(name: str) -> typing.Any:
    if name in ("CheckpointHandler", "CheckpointSave", "CheckpointRestore"):
        from chute._src.frameworks.orbax_handler import orbax_class

        return orbax_class(name)
    raise AttributeError(f"module 'chute.checkpoint' has no attribute {name!r}")
