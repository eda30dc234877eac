"""Turning `paths` arguments (a path, a URL, a glob, a list of them) into a sorted file list.

Local paths (and `file://` URLs, which become local paths) are expanded with `glob`;
other URLs (`s3://`, `gs://`, `memory://`, ...) through fsspec (`_src/remote`), with the
same rules: a pattern's matches sorted, plain paths in the order given, anything that
names nothing an error. Plain s3/http URLs are found by asking for their first byte, all
at once through the range client (`remote.file.find_objects`); the rest by `fs.info`.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Any

from chute._src.errors import MissingFileError
from chute._src.remote.urls import StorageOptions, is_url, local_path

__all__ = ["MissingFileError", "PathsArg", "expand_paths"]

PathsArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def _check_item(item: Any, who: str) -> str:
    if isinstance(item, str | os.PathLike):
        return os.fspath(item)
    if hasattr(item, "read"):
        raise TypeError(
            f"{who}: got a file object ({type(item).__name__}); chute reads files by name "
            "so that sources can be pickled to worker processes and reopened: pass the "
            "path or URL (s3://, gs://, memory://, ... with storage_options=)"
        )
    raise TypeError(f"{who}: {item!r} is not a path or URL; pass a str or os.PathLike")


def _expand_url(p: str, who: str, storage_options: StorageOptions) -> list[str]:
    from chute._src.remote.calls import call
    from chute._src.remote.urls import filesystem, to_url

    fs, path = filesystem(p, storage_options)
    if glob.has_magic(path):
        found = call(p, "list it", lambda: fs.glob(path, detail=True))
        files = sorted(to_url(fs, k) for k, v in found.items() if v.get("type") != "directory")
        if not files:
            raise MissingFileError(
                f"{who}: {p!r}: the pattern matches no object; check the pattern, the bucket "
                "and the storage options"
            )
        return files
    try:
        call(p, "find it", lambda: fs.info(path))
    except MissingFileError as e:
        raise MissingFileError(f"{who}: {e}") from e.__cause__
    return [p]


def expand_paths(paths: PathsArg, who: str, storage_options: StorageOptions = None) -> list[str]:
    """Expands each glob pattern (sorted); keeps plain paths in the order given.

    Raises `MissingFileError` (a `chute.DataError` and a `FileNotFoundError`) naming
    `who` and the path when a path or pattern matches nothing, and TypeError for a file
    object (chute reopens files by name in worker processes).
    """
    items = [paths] if isinstance(paths, str | os.PathLike) else paths
    if hasattr(items, "read"):
        items = [items]  # type: ignore[list-item]
    items = list(items)
    if not items:
        raise ValueError(f"{who} needs at least one path; got an empty list")
    checked = [_check_item(item, who) for item in items]
    urls = [p for p in checked if is_url(p)]
    expanded: dict[str, list[str]] = {}
    if urls:  # each costs a round trip or more: asked concurrently, answered in order
        from chute._src.remote.file import find_objects, open_concurrently

        plain = [p for p in urls if not glob.has_magic(p)]
        expanded = {p: [p] for p, ok in zip(plain, find_objects(plain, storage_options)) if ok}
        rest = [p for p in urls if p not in expanded]
        found = open_concurrently(lambda k: _expand_url(rest[k], who, storage_options), rest)
        expanded.update(zip(rest, found))
    out: list[str] = []
    for p in checked:
        if is_url(p):
            out.extend(expanded[p])
            continue
        p = local_path(p)
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
