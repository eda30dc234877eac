"""Where sharded outputs go: the one seam between chute's shard writers and storage.

What `chute.beam` and `write_manifest` do to an output directory goes through these few
functions: list it, make it, stat or read a file in it, and write a file there
atomically (`local_target`). They take local paths today; a URL scheme plugs in here
(`local_target` then hands out a local staging file and uploads it on success).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["exists", "join", "list_names", "local_target", "make_dirs", "read_bytes", "remove"]


def join(directory: str, name: str) -> str:
    """The path of `name` inside `directory`."""
    return os.path.join(directory, name)


def list_names(directory: str) -> list[str]:
    """The names in `directory`, sorted; [] when it does not exist."""
    try:
        return sorted(e.name for e in os.scandir(directory))
    except FileNotFoundError:
        return []


def make_dirs(directory: str) -> None:
    Path(directory).mkdir(parents=True, exist_ok=True)


def exists(path: str) -> bool:
    return os.path.lexists(path)


def read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def remove(path: str) -> None:
    """Removes a file chute wrote itself (never a user's: callers prove it first)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def local_target(path: str) -> Iterator[Path]:
    """The local path to write the file for `path` to, with a writer that writes
    atomically (a temporary name, then a rename: chute's own writers all do). For a
    local `path` it is `path` itself."""
    yield Path(path)
