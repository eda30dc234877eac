"""Files in shared memory that no process leaves behind, how they reach worker processes,
and the sweep of the names older versions left.

**No names.** Every file chute shares between its processes (a worker's slab,
`_src/exec/mp/slabs.py`; the store of `MapDataset.cache()` under workers,
`_src/ops/cache_stores.py`; a large list source, `_src/storage/formats/shared_list.py`)
is made without a name (`anonymous_file`): `open(directory, O_TMPFILE)` in a tmpfs
directory (`/dev/shm`), so it counts against that filesystem's size as a named file does,
and the kernel frees it when the last descriptor and mapping of it go, whatever ends the
processes (SIGKILL, the OOM killer, a preemption). Only where the filesystem has no
`O_TMPFILE` is a name made, and removed at once: it exists for microseconds.

**Handing over.** Such a file reaches chute's worker processes as a descriptor passed
when they start, never by name. An object holding one pickles as a key and calls
`hand_over(key, fd, self)` as it does. Pickled under `handing_over()` (as `mp_prefetch`
pickles its pipeline), the descriptor is collected (with its owner, kept alive); the
worker pool passes the collected descriptors to each worker as it starts (with the start
method's own fd passing, as for the slabs), and the worker records them (`receive`) before it unpickles the pipeline,
where the object finds its descriptor by key (`received`). Pickled anywhere else, no
descriptor goes with it: `received` returns None and the object decides what it is
without it (the cache's store starts empty and private; a list source refuses).

**Names left behind.** Earlier versions of chute named their files
(`chute_cache_<pid>_<hex>`, `chute_list_<pid>_<hex>`, slabs `chute_<pid>_<hex>`), and a
killed job left them in `/dev/shm`. `sweep_left_behind` removes them when chute next
starts workers or makes a cache store or a list file: only files of those names, owned by this user, older than a minute
(never one in creation), and that no process holds: the maker of a cache or list file
held a shared `flock` on it for as long as it lived, so a file that can be locked
exclusively without waiting has no live owner, whatever its pid (pids are reused, and
containers sharing `/dev/shm` see other pids), while one still held is kept.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Iterator, Mapping

__all__ = [
    "LEFT_BEHIND",
    "HandedFiles",
    "anonymous_file",
    "hand_over",
    "handing_over",
    "receive",
    "received",
    "sweep_left_behind",
    "sweep_stale",
]

# A file younger than this may be in creation (made, not yet locked): never swept.
MIN_AGE_S = 60.0

LEFT_BEHIND = re.compile(r"^chute_(?:cache_|list_)?\d+_[0-9a-f]+$")
"""The names chute's shared files had (and have where `O_TMPFILE` is missing, for
microseconds)."""

# errnos of a filesystem or kernel without O_TMPFILE (EISDIR: a kernel that ignores the
# flag and opens the directory; EOPNOTSUPP: a filesystem without it).
_NO_TMPFILE = {errno.EISDIR, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOENT}


def anonymous_file(directory: str, prefix: str = "chute_") -> int:
    """A new empty file of this user (0600) in `directory` with no name; its descriptor
    (close-on-exec). `prefix` names the brief file made where `O_TMPFILE` is missing."""
    flags = os.O_RDWR | os.O_CLOEXEC
    tmpfile = getattr(os, "O_TMPFILE", 0)
    if tmpfile:
        try:
            return os.open(directory, flags | tmpfile, 0o600)
        except OSError as e:
            if e.errno not in _NO_TMPFILE or not os.path.isdir(directory):
                raise
    path = os.path.join(directory, f"{prefix}{os.getpid()}_{secrets.token_hex(8)}")
    fd = os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.unlink(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


# -- handing descriptors to worker processes --------------------------------------------

_collecting = threading.local()
_received: dict[str, int] = {}


class HandedFiles:
    """The shared files pickled under `handing_over()`: their descriptors by key (`fds`),
    kept open as long as this object lives (it holds the objects that own them)."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}
        self._owners: list[object] = []

    def add(self, key: str, fd: int, owner: object) -> None:
        if key not in self.fds:
            self.fds[key] = fd
            self._owners.append(owner)


@contextlib.contextmanager
def handing_over() -> Iterator[HandedFiles]:
    """Collects the shared files pickled in this thread inside the block; hand their
    descriptors to the processes that unpickle what was pickled, and keep the result
    until those processes have started."""
    outer = getattr(_collecting, "files", None)
    _collecting.files = files = HandedFiles()
    try:
        yield files
    finally:
        _collecting.files = outer


def hand_over(key: str, fd: int, owner: object) -> None:
    """Called by `owner`'s `__reduce__`, a shared file's: its descriptor goes with the
    pickle when pickled under `handing_over()`; otherwise nothing goes."""
    files: HandedFiles | None = getattr(_collecting, "files", None)
    if files is not None:
        files.add(key, fd, owner)


def receive(fds: Mapping[str, int]) -> None:
    """Records the descriptors handed to this process (a worker, as it starts); they stay
    open as long as it lives."""
    _received.update(fds)


def received(key: str) -> int | None:
    """A new descriptor (close-on-exec) of the file handed to this process under `key`,
    or None if none was."""
    fd = _received.get(key)
    return None if fd is None else fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0)


# -- names left behind ------------------------------------------------------------------


def sweep_left_behind(directory: str) -> None:
    """Removes the files of `LEFT_BEHIND`'s names in `directory` whose makers are gone
    (see the module docstring)."""
    sweep_stale(directory, LEFT_BEHIND)


def sweep_stale(directory: str, name: re.Pattern[str], min_age_s: float = MIN_AGE_S) -> None:
    """Removes the files in `directory` whose names match `name`, that this user owns,
    that are older than `min_age_s` and that no process holds locked."""
    try:
        names = [n for n in os.listdir(directory) if name.match(n)]
    except OSError:
        return
    for n in names:
        path = os.path.join(directory, n)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # gone, or unreadable
            continue
        try:
            st = os.fstat(fd)
            young = time.time() - st.st_mtime < min_age_s
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or young:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held by a live process
                continue
            # Still the file we locked (not replaced since the listing): remove it.
            with contextlib.suppress(OSError):
                if os.stat(path, follow_symlinks=False).st_ino == st.st_ino:
                    os.unlink(path)
        finally:
            os.close(fd)
