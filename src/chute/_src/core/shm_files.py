"""Files in shared memory that outlive no process: the sweep both shared stores use.

A process that makes such a file (`_src/storage/formats/shared_list.py`,
`_src/ops/shared_cache.py`) holds a shared `flock` on it for as long as it lives. A later
process sweeps the files of its kind that nobody holds any more (their makers died without
removing them): it takes an exclusive lock without waiting, and only if that succeeds
removes the file, after checking the name still names the file it locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import time

__all__ = ["sweep_stale"]

# A file younger than this may be in creation (made, not yet locked): never swept.
MIN_AGE_S = 60.0


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
