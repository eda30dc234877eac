"""Opening data files with errors that name them, and noticing files that shrink while open.

A memory-mapped file that is truncated while mapped makes every later access past the
new end fault with SIGBUS, which kills the process. Readers that map a file therefore
keep a descriptor (`FileGuard`) and, once per `__getitem__`/`__getitems__` call, compare
the file's current size (`os.lseek(fd, 0, SEEK_END)`: one system call, under a
microsecond) with the size it had when opened: a file that shrank raises
`chute.DataError` instead. A truncation that lands between that check and the copy out
of the map (well under a microsecond for a record, the whole block for a block) can
still fault; `docs/design.md` ("Storage") says so.
"""

from __future__ import annotations

import errno
import os
import resource
import stat

from chute._src.errors import DataError

__all__ = ["FileGuard", "open_error", "shrunk_error"]

SEEK_END = os.SEEK_END
_FIX = "re-create it or restore a good copy"


def open_error(path: str, e: OSError, what: str) -> DataError:
    """A DataError naming `path` for an OSError met while opening it."""
    if isinstance(e, FileNotFoundError):
        why = "no such file", "check the path, or that every file of the dataset was copied"
    elif isinstance(e, IsADirectoryError):
        why = "it is a directory", "name the file(s) inside it, or a glob pattern"
    elif isinstance(e, PermissionError):
        why = "permission denied", "make it readable by this user (chmod, chown)"
    else:
        why = f"{e.strerror or e}", "check the file system and the path"
    err = DataError(f"{path}: {why[0]}: cannot read it as {what}; {why[1]}")
    err.__cause__ = e
    return err


def shrunk_error(path: str, now: int, then: int, record: int | None = None) -> DataError:
    where = f" record {record}:" if record is not None else ""
    return DataError(
        f"{path}:{where} the file shrank from {then} to {now} bytes while open (it was "
        "truncated or rewritten in place); reading it could crash the process, so chute "
        "stops; write data files to a new name and rename them into place, then reopen"
    )


def _raise_fd_limit() -> bool:
    """Raises the soft limit on open files to the hard limit; True if it grew."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return True


class FileGuard:
    """An open read-only descriptor on `path` and the file's size when opened.

    Raises `DataError` naming `path` (with the OSError as `__cause__`) when the path is
    missing, a directory, unreadable or not a regular file. A process that runs out of
    descriptors (many shards, each held open) has its soft limit raised to the hard one.
    """

    __slots__ = ("fd", "path", "size")

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        try:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                if e.errno != errno.EMFILE or not _raise_fd_limit():
                    raise
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise open_error(path, e, what) from e
        try:
            st = os.fstat(fd)
        except OSError as e:  # pragma: no cover - fstat on an open fd does not fail
            os.close(fd)
            raise open_error(path, e, what) from e
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):
                raise open_error(path, IsADirectoryError(errno.EISDIR, "Is a directory"), what)
            raise DataError(f"{path}: cannot open {what}: it is not a regular file; {_FIX}")
        self.fd = fd
        self.size = st.st_size

    def check(self, record: int | None = None) -> None:
        """Raises DataError if the file is now shorter than when it was opened."""
        now = os.lseek(self.fd, 0, SEEK_END)
        if now < self.size:
            raise shrunk_error(self.path, now, self.size, record)

    def error(self, record: int | None = None) -> DataError:
        """The DataError for a file found shorter than when opened."""
        return shrunk_error(self.path, os.lseek(self.fd, 0, SEEK_END), self.size, record)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()
