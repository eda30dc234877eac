"""Turning `paths` arguments (a path, a glob, a list of them) into a sorted file list."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

__all__ = ["PathsArg", "expand_paths"]

PathsArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def expand_paths(paths: PathsArg, who: str) -> list[str]:
    """Expands each glob pattern (sorted); keeps plain paths in the order given.

    Raises FileNotFoundError naming `who` when a path or pattern matches nothing.
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise ValueError(f"{who} needs at least one path; got an empty list")
    out: list[str] = []
    for item in items:
        p = os.fspath(item)
        if glob.has_magic(p):
            matches = sorted(glob.glob(p))
            if not matches:
                raise FileNotFoundError(f"{who}: the pattern {p!r} matches no file")
            out.extend(matches)
        elif os.path.exists(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"{who}: no such file or directory: {p!r}")
    return out
