"""Orbax's argument classes for `CheckpointHandler`, registered with it on import.

Imported only when `chute.checkpoint.CheckpointSave` or `CheckpointRestore` is first
used: it imports Orbax (and so JAX).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chute._src.orbax_handler import CheckpointHandler

try:
    import orbax.checkpoint as ocp
except ImportError as e:
    raise ImportError(
        "chute.checkpoint.CheckpointSave/CheckpointRestore need Orbax, which is not "
        "installed: pip install 'chute[orbax]'."
    ) from e


@ocp.args.register_with_handler(CheckpointHandler, for_save=True)
@dataclasses.dataclass
class CheckpointSave(ocp.args.CheckpointArgs):
    """Saves `item` (a chute iterator) with `CheckpointHandler`."""

    item: Any


@ocp.args.register_with_handler(CheckpointHandler, for_restore=True)
@dataclasses.dataclass
class CheckpointRestore(ocp.args.CheckpointArgs):
    """Restores `item` (a chute iterator of the same pipeline) in place."""

    item: Any
