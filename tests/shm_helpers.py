"""What of chute's is in shared memory: names in `/dev/shm`, and the unnamed files a
process holds open.

chute's shared files have no name (`core/shm_files.py`), so a test finds them through
the process that holds them: `/proc/<pid>/fd` links to `/dev/shm/#<inode> (deleted)`.
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Any

SHM = "/dev/shm"
CHUTE_NAME = re.compile(r"^chute_")
LIST_MAGIC = b"CHUTELST"
CACHE_MAGIC = b"CHUTECAC"


def chute_names(pids: set[int] | None = None) -> set[str]:
    """The entries of `/dev/shm` chute's naming gives (`chute_...`); with `pids`, only
    those naming one of them (`chute_<pid>_`, `chute_cache_<pid>_`, `chute_list_<pid>_`),
    so that other runs of chute on the machine are not counted."""
    if not os.path.isdir(SHM):
        return set()
    names = {n for n in os.listdir(SHM) if CHUTE_NAME.match(n)}
    if pids is None:
        return names
    wanted = {str(p) for p in pids}
    return {n for n in names if any(part in wanted for part in n.split("_"))}


def held_shared_files(pid: int | str = "self", magic: bytes | None = None) -> set[int]:
    """The inodes of the files in `/dev/shm` (named or not) that process `pid` holds open;
    with `magic`, only those whose first bytes are `magic` (a list source or a cache)."""
    found = set()
    folder = f"/proc/{pid}/fd"
    for n in os.listdir(folder):
        path = os.path.join(folder, n)
        try:
            if not os.readlink(path).startswith(SHM + "/"):
                continue
            st = os.stat(path)
            if magic is not None:
                with open(path, "rb") as f:  # the magic link opens the unnamed file too
                    if f.read(len(magic)) != magic:
                        continue
        except OSError:  # closed meanwhile
            continue
        found.add(st.st_ino)
    return found


def mapped_shared_files(pid: int | str = "self") -> set[int]:
    """The inodes of the files in `/dev/shm` that process `pid` has mapped."""
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(SHM + "/"):
                found.add(int(fields[4]))
    return found


class Unpickled:
    """A `worker_fn` that unpickles `payload` (a callable) once in the worker and calls it
    with each task: as `mp_prefetch`'s worker unpickles its pipeline."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.fn: Any = None

    def __call__(self, index: int, count: int, task: Any) -> Any:
        if self.fn is None:
            self.fn = pickle.loads(self.payload)
        return self.fn(task)
