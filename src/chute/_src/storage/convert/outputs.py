"""Where sharded outputs go: the one seam between chute's shard writers and storage.

What `chute.beam` and `write_manifest` do to an output directory goes through these few
functions: list it, make it, stat or read a file in it, and write a file there
atomically (`local_target`). A local path is a directory of plain files. A URL
(`s3://bucket/prefix`, ...) is a prefix of an object store, reached through fsspec with
`storage_options` and `call` (bounded retries, clear `DataError`s): making it is a no-op,
and `local_target` hands out a local staging file that is uploaded whole on success (a
PUT is atomic: an object appears complete or not at all).
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from chute._src.storage.remote.calls import call
from chute._src.storage.remote.urls import StorageOptions, filesystem, is_url

__all__ = [
    "exists",
    "join",
    "list_names",
    "local_copy",
    "local_target",
    "make_dirs",
    "read_bytes",
    "remove",
]


def join(directory: str, name: str) -> str:
    """The path of `name` inside `directory` (a URL is joined with `/`)."""
    if is_url(directory):
        return f"{directory.rstrip('/')}/{name}"
    return os.path.join(directory, name)


def list_names(directory: str, storage_options: StorageOptions = None) -> list[str]:
    """The names in `directory`, sorted; [] when it does not exist."""
    if is_url(directory):
        fs, path = filesystem(directory, storage_options)

        def names() -> list[str]:
            try:
                found = fs.ls(path.rstrip("/"), detail=False, refresh=True)
            except FileNotFoundError:
                return []
            return sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in found)

        return call(directory, "list it", names)
    try:
        return sorted(e.name for e in os.scandir(directory))
    except FileNotFoundError:
        return []


def make_dirs(directory: str, storage_options: StorageOptions = None) -> None:
    """Makes `directory`; nothing to do for a URL (an object store has no directories)."""
    if not is_url(directory):
        Path(directory).mkdir(parents=True, exist_ok=True)


def exists(path: str, storage_options: StorageOptions = None) -> bool:
    if is_url(path):
        fs, p = filesystem(path, storage_options)
        fs.invalidate_cache(p)  # another process may have written it since
        return bool(call(path, "look for it", lambda: fs.exists(p)))
    return os.path.lexists(path)


def read_bytes(path: str, storage_options: StorageOptions = None) -> bytes:
    if is_url(path):
        fs, p = filesystem(path, storage_options)
        data: bytes = call(path, "read it", lambda: fs.cat_file(p))
        return data
    return Path(path).read_bytes()


def remove(path: str, storage_options: StorageOptions = None) -> None:
    """Removes a file chute wrote itself (never a user's: callers prove it first)."""
    if is_url(path):
        fs, p = filesystem(path, storage_options)

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(p)

        call(path, "remove it", rm)
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


@contextlib.contextmanager
def local_copy(path: str, storage_options: StorageOptions = None) -> Iterator[Path]:
    """A local file with the content of `path` (same base name), for readers that need
    one: `path` itself when local; for a URL, a downloaded copy removed afterwards."""
    if not is_url(path):
        yield Path(path)
        return
    fs, p = filesystem(path, storage_options)
    with tempfile.TemporaryDirectory(prefix="chute-read-") as tmp:
        local = Path(tmp) / _basename(path)
        call(path, "download it", functools.partial(fs.get_file, p, str(local)))
        yield local


@contextlib.contextmanager
def local_target(path: str, storage_options: StorageOptions = None) -> Iterator[Path]:
    """The local path to write the file for `path` to, with a writer that writes
    atomically (a temporary name, then a rename: chute's own writers all do). For a
    local `path` it is `path` itself; for a URL, a file (of the same base name) in a
    temporary directory, uploaded whole when the block ends without an error, then
    removed. Nothing is uploaded if the writer left no file."""
    if not is_url(path):
        yield Path(path)
        return
    fs, p = filesystem(path, storage_options)
    with tempfile.TemporaryDirectory(prefix="chute-write-") as tmp:
        local = Path(tmp) / _basename(path)
        yield local
        if local.is_file():
            call(path, "upload it", functools.partial(fs.put_file, str(local), p))
            fs.invalidate_cache(p)
