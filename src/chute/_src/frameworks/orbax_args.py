"""`CheckpointHandler` as a real Orbax handler, and its argument classes registered with it.

Imported when `chute.checkpoint.CheckpointHandler`, `CheckpointSave` or
`CheckpointRestore` is first used (whichever comes first: the three are made and
registered together, so every Orbax style works in any order): it imports Orbax (and so
JAX). The handler subclasses `orbax.checkpoint.CheckpointHandler`, so that Orbax takes it
as one of its own (`item_handlers=`, `Checkpointer(handler)`), not as a legacy handler it
wraps; its behaviour is `_src/frameworks/orbax_handler.py`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chute._src.frameworks import orbax_handler

try:
    import orbax.checkpoint as ocp
except ImportError as e:
    raise ImportError(
        "chute.checkpoint.CheckpointHandler/CheckpointSave/CheckpointRestore are for "
        "Orbax, which is not installed: pip install 'chute[orbax]' (chute.checkpoint.save "
        "and load need nothing)."
    ) from e


class CheckpointHandler(orbax_handler.CheckpointHandler, ocp.CheckpointHandler):
    """Orbax `CheckpointHandler` for chute iterators (Grain's name and behaviour): see
    `chute._src.frameworks.orbax_handler.CheckpointHandler`."""


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
