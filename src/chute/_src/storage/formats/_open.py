"""The one place where readers open a data file by name: a local path (or `file://` URL)
becomes a `FileGuard` (mapped, leased), any other URL a `RemoteFile` (range reads through
the block cache). Both offer `size`, `leased`, `check`, `mapping()` (what to slice for
bytes), `explain(err)` and `close()`."""

from __future__ import annotations

import io

from chute._src.storage.formats._file_guard import FileGuard
from chute._src.storage.remote.file import RemoteFile
from chute._src.storage.remote.urls import StorageOptions, is_url, local_path

__all__ = ["DataFile", "open_binary", "open_data"]

DataFile = FileGuard | RemoteFile
_STREAM_WINDOW = 1 << 20  # bytes of a remote stream read per request, and read ahead


def open_data(
    path: str, what: str, storage_options: StorageOptions = None, *, lease: bool = True
) -> DataFile:
    """`path` opened for reading; `DataError` naming it if it cannot be."""
    if is_url(path):
        return RemoteFile(path, storage_options, what)
    return FileGuard(local_path(path), what, lease=lease)


def open_binary(path: str, what: str, storage_options: StorageOptions = None) -> io.BufferedReader:
    """A seekable binary file object over `path` (buffered reads for streams; a remote
    object's next window read ahead)."""
    if is_url(path):
        return RemoteFile(path, storage_options, what).reader(_STREAM_WINDOW, sequential=True)
    return open(local_path(path), "rb")
