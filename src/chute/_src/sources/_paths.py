"""Turning `paths` arguments (a path, a glob, a list of them) into a sorted file list."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from chute._src.errors import DataError

__all__ = ["MissingFileError", "PathsArg", "expand_paths"]

PathsArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class MissingFileError(DataError, FileNotFoundError):
    """A data file or pattern that names nothing: a `DataError`, and a `FileNotFoundError`."""


def expand_paths(paths: PathsArg, who: str) -> list[str]:
    """Expands each glob pattern (sorted); keeps plain paths in the order given.

    Raises `MissingFileError` (a `chute.DataError` and a `FileNotFoundError`) naming
    `who` and the path when a path or pattern matches nothing.
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
                raise MissingFileError(
                    f"{who}: {p!r}: the pattern matches no file; check the pattern and "
                    "the directory it names"
                )
            out.extend(matches)
        else:
            try:
                os.stat(p)
            except (FileNotFoundError, NotADirectoryError) as e:
                raise MissingFileError(
                    f"{who}: {p!r}: no such file or directory; check the path, or that "
                    "every file of the dataset was copied"
                ) from e
            except OSError:  # permission denied on the way, ...: the reader names it
                pass
            out.append(p)
    return out
