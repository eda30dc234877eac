"""Importing Ray (the `[ray]` extra) and connecting this process to a cluster."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

MISSING = "chute.ray needs Ray, which is not installed: pip install 'chute[ray]'."

log = logging.getLogger("chute")


def require_ray() -> ModuleType:
    """The `ray` module, or an ImportError naming the extra."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(MISSING) from e
    return ray


def connect(address: str | None) -> ModuleType:
    """Ray, connected: to `address` when this process has not called `ray.init` yet."""
    ray = require_ray()
    if not ray.is_initialized():
        log.info("chute: connecting to Ray (address=%r)", address)
        ray.init(address=address, log_to_driver=True)
    return ray


def system_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """The Ray errors that mean a result was lost with its actor or node (computed again
    elsewhere), not that the code computing it raised."""
    names = (
        "RayActorError",  # killed, crashed, its node gone (ActorDiedError...)
        "ObjectLostError",  # the result's copy was on a node that is gone
        "WorkerCrashedError",
        "NodeDiedError",
        "OutOfMemoryError",  # Ray's memory monitor killed the worker
        "ActorUnavailableError",
    )
    found = (getattr(ray.exceptions, name, None) for name in names)
    return tuple(e for e in found if isinstance(e, type))
