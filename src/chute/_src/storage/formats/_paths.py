"""Turning `paths` arguments (a path, a URL, a glob, a list of them) into a sorted file list.

Local paths (and `file://` URLs, which become local paths) are expanded with `glob`;
other URLs with the same rules: a pattern's matches sorted, plain paths in the order
given, anything that names nothing an error. The URLs obstore reads (`s3://`, `gs://`,
`az://`, `http(s)://`; `_src/storage/remote/stores.py`) are found by asking for their first
block, all at once (`remote.file.find_objects`), and listed through obstore; the rest
(`memory://`, ...) through fsspec's `info` and `glob`. A URL naming a directory (a prefix
with objects under it) is kept, as a local directory is: a dataset directory is opened
through its `manifest.json` (`remote_manifest`), anything else is named a directory by
the reader.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from chute._src.core.errors import MissingFileError
from chute._src.core.in_flight import REMOTE_READS_IN_FLIGHT
from chute._src.storage.remote.urls import StorageOptions, is_url, local_path

__all__ = [
    "MissingFileError",
    "PathsArg",
    "expand_paths",
    "reads_in_flight_for",
    "remote_manifest",
]

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


def _expand_url(
    p: str, who: str, storage_options: StorageOptions, failed: BaseException | None = None
) -> list[str]:
    """The objects a URL names: a pattern's matches (sorted), or the URL itself (an
    object, or a directory, which the reader names as such or opens as a dataset).
    `failed`: how asking for its first block just ended (not asked again)."""
    from chute._src.storage.remote import fetch
    from chute._src.storage.remote.calls import call, obstore_failure
    from chute._src.storage.remote.stores import display_url, located
    from chute._src.storage.remote.urls import filesystem, to_url

    loc = located(p, storage_options)
    shown = display_url(p)
    if loc is not None and (loc.kind != "http" or not glob.has_magic(loc.path)):
        if glob.has_magic(loc.path):
            files = _match(p, loc, fetch)
            if not files:
                raise MissingFileError(
                    f"{who}: {shown!r}: the pattern matches no object; check the pattern, "
                    "the bucket and the storage options"
                )
            return files
        got = failed if failed is not None else fetch.read_first([(loc, 1)])[0]
        if not isinstance(got, BaseException):
            return [p]
        err = obstore_failure(shown, got, "find it")
        if isinstance(err, MissingFileError) and _is_directory(p, loc, fetch):
            return [p]
        if isinstance(err, MissingFileError):
            raise MissingFileError(f"{who}: {err}") from got
        raise err from got
    fs, path = filesystem(p, storage_options)
    if glob.has_magic(path):
        found = call(shown, "list it", lambda: fs.glob(path, detail=True))
        files = sorted(to_url(fs, k) for k, v in found.items() if v.get("type") != "directory")
        if not files:
            raise MissingFileError(
                f"{who}: {shown!r}: the pattern matches no object; check the pattern, the "
                "bucket and the storage options"
            )
        return files
    try:
        call(shown, "find it", lambda: fs.info(path))
    except MissingFileError as e:
        raise MissingFileError(f"{who}: {e}") from e.__cause__
    return [p]


def _is_directory(url: str, loc: Any, fetch: Any) -> bool:
    """Whether `url`, no object, is a directory: objects are listed under it, or (over
    plain HTTP, which lists nothing) it holds a dataset's `manifest.json`."""
    try:
        if loc.kind != "http":
            return bool(fetch.list_prefix(loc, limit=1))
        manifest = dataclasses.replace(loc, path=loc.path.rstrip("/") + "/manifest.json")
        return not isinstance(fetch.read_first([(manifest, 1)])[0], BaseException)
    except Exception:  # the listing failed: the object is missing, as the read said
        return False


def _match(url: str, loc: Any, fetch: Any) -> list[str]:
    """The URLs of the objects matching the pattern `url` (of an obstore store: listed
    under the pattern's fixed prefix), sorted. `*` and `?` stay within one level, `**`
    crosses levels, as in fsspec's glob."""
    path: str = loc.path
    fixed = path[: min(path.find(c) for c in "*?[" if c in path)]
    prefix_dir = fixed.rsplit("/", 1)[0] if "/" in fixed else ""
    pattern = re.compile(_glob_regex(path))
    base = url[: len(url) - len(path)]
    listed = fetch.list_prefix(dataclasses.replace(loc, path=prefix_dir))
    return sorted(base + key for key, _ in listed if pattern.fullmatch(key))


def _glob_regex(pattern: str) -> str:
    """A regex for a glob pattern (`**`: any levels, `*`: within a level).

    >>> bool(re.fullmatch(_glob_regex("d/**/*.jsonl"), "d/a/b/x.jsonl"))
    True
    >>> bool(re.fullmatch(_glob_regex("d/*.jsonl"), "d/a/x.jsonl"))
    False
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def remote_manifest(url: str, storage_options: StorageOptions) -> str | None:
    """The URL of the `manifest.json` of the dataset directory `url` names (the manifest
    itself, or a directory-like name holding one), or None: `url` is a data object."""
    from chute._src.storage.remote.calls import call
    from chute._src.storage.remote.file import find_objects
    from chute._src.storage.remote.stores import display_url, located
    from chute._src.storage.remote.urls import filesystem

    name = url.rstrip("/").rsplit("/", 1)[-1]
    if name == "manifest.json":
        return url
    if "." in name or glob.has_magic(url):
        return None
    manifest = url.rstrip("/") + "/manifest.json"
    if find_objects([manifest], storage_options)[0]:
        return manifest
    if located(manifest, storage_options) is not None:
        return None  # obstore's answer is the store's
    fs, path = filesystem(manifest, storage_options)
    return manifest if call(display_url(manifest), "look for it", lambda: fs.exists(path)) else None


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
        from chute._src.storage.remote.file import find_objects, open_concurrently

        plain = [p for p in urls if not glob.has_magic(p)]
        failed: dict[str, BaseException] = {}
        found_now = find_objects(plain, storage_options, failed)
        expanded = {p: [p] for p, ok in zip(plain, found_now) if ok}
        rest = [p for p in urls if p not in expanded]
        found = open_concurrently(
            lambda k: _expand_url(rest[k], who, storage_options, failed.get(rest[k])), rest
        )
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


def reads_in_flight_for(paths: Iterable[str]) -> int:
    """What a file source over `paths` declares as its `reads_in_flight`
    (`_src/core/in_flight.py`): `REMOTE_READS_IN_FLIGHT` when one of them is a URL (each
    read waits a round trip), else 0 (a local read costs CPU)."""
    return REMOTE_READS_IN_FLIGHT if any(is_url(p) for p in paths) else 0
