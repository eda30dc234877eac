"""Shared-memory slabs: one reusable block of shared memory per worker.

A slab is a file with no name in a tmpfs directory (`/dev/shm` by default; `O_TMPFILE`,
`core/shm_files.anonymous_file`): only file descriptors and mappings keep it alive, so
nothing can be left in the directory, whatever happens to the processes (even SIGKILL of
the main process). The main process
passes the descriptor of each worker's first slab to it when it starts (`InheritedFd`). A
worker whose results outgrow its slab makes a larger one itself and passes its descriptor
back over the pipe (`send_fd`, SCM_RIGHTS); the old one is unmapped once its last region
is freed.

The memory is reserved up front with `posix_fallocate`: on a full tmpfs this fails with a
clean `OSError` here, instead of a SIGBUS later when a page is first written. Both
processes map a slab lazily: its pages are faulted in as results first fill them (a fault
per page, once per slab lifetime). Populating a worker's mapping up front (`MAP_POPULATE`)
cost ~5 ms for 16 MiB before its first task, for results that may fill a few pages (rows
of text); populating the main process's would add ~0.4 ms per MiB to the pool's start,
serially.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection

from chute._src.core.shm_files import anonymous_file

__all__ = [
    "DEFAULT_SHM_DIR",
    "InheritedFd",
    "SlabPlan",
    "available_bytes",
    "create_slab_fd",
    "map_slab",
    "plan_slabs",
    "recv_fd",
    "send_fd",
]

DEFAULT_SHM_DIR = "/dev/shm"
PAGE = mmap.PAGESIZE
# Below this a slab is not worth having: results would mostly go through pipes anyway.
MIN_SLAB_BYTES = 1 << 20


def available_bytes(directory: str) -> int:
    """Free bytes in `directory`'s filesystem, as an unprivileged process sees them."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True)
class SlabPlan:
    """Each worker's first slab size and the size its slab may grow to (0: no slab)."""

    initial_bytes: int
    limit_bytes: int
    warning: str | None


def _fix_hint(directory: str) -> str:
    return (
        f"Give {directory} more space (in Docker: `docker run --shm-size=2g ...`; "
        "in Kubernetes: an emptyDir with `medium: Memory` mounted there), or pass a "
        "smaller `shm_bytes_per_worker`"
    )


def _pages(n: int) -> int:
    return n // PAGE * PAGE


def plan_slabs(
    num_workers: int,
    requested: int | None,
    directory: str,
    *,
    initial: int = 16 << 20,
    limit: int = 1 << 30,
) -> SlabPlan:
    """Sizes the workers' slabs from the request and the free space in `directory`.

    An explicit request is a fixed size; if all workers' slabs do not fit, there are no
    slabs (results go through pipes). By default a slab starts at `initial` bytes and may
    grow to `limit`, shrunk to share half the free space; below `MIN_SLAB_BYTES` of it
    there are no slabs.
    """
    if requested == 0:
        return SlabPlan(0, 0, None)
    mib = 1 << 20
    try:
        free = available_bytes(directory)
    except OSError as e:
        return SlabPlan(
            0,
            0,
            f"cannot use shared memory in {directory!r} ({e}); results go through pipes, "
            "which is slower. Pass `shm_dir` naming a tmpfs directory that exists.",
        )
    if requested is not None:
        want = -(-requested // PAGE) * PAGE
        if want * num_workers <= free:
            return SlabPlan(want, want, None)
        return SlabPlan(
            0,
            0,
            f"{num_workers} worker(s) x {want / mib:.1f} MiB of shared memory do not fit in "
            f"the {free / mib:.1f} MiB free in {directory}; results go through pipes, which "
            f"is slower. {_fix_hint(directory)}.",
        )
    share = _pages(free // 2 // num_workers)
    if share < MIN_SLAB_BYTES:
        return SlabPlan(
            0,
            0,
            f"only {free / mib:.1f} MiB of shared memory is free in {directory}, too little "
            f"for {num_workers} worker(s); results go through pipes, which is slower. "
            f"{_fix_hint(directory)}.",
        )
    grow_to = min(limit, share)
    warning = None
    if grow_to < limit and grow_to < 4 * initial:
        warning = (
            f"only {free / mib:.0f} MiB of shared memory is free in {directory}, so each of "
            f"{num_workers} worker(s) gets at most {grow_to / mib:.1f} MiB; larger results go "
            f"through pipes, which is slower. {_fix_hint(directory)}."
        )
    return SlabPlan(min(initial, grow_to), grow_to, warning)


def create_slab_fd(directory: str, nbytes: int) -> int:
    """Creates a fully allocated shared file of `nbytes` with no name; returns its fd.

    Raises `OSError` (ENOSPC, EFBIG, ...) when the memory cannot be reserved.
    """
    fd = anonymous_file(directory)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_slab(fd: int, nbytes: int) -> mmap.mmap:
    """Maps a slab read-write and shared. Its pages are faulted in as results first fill
    them, not up front (MAP_POPULATE: 5 ms for 16 MiB, 43 ms for 77 MiB, before the
    first result, which may need a few pages); `create_slab_fd` reserved them already."""
    return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def send_fd(conn: Connection, fd: int) -> None:
    """Sends a copy of `fd` over a Unix-socket connection (the peer calls `recv_fd`)."""
    reduction.send_handle(conn, fd, 0)  # the pid is only used on Windows


def recv_fd(conn: Connection) -> int:
    return int(reduction.recv_handle(conn))


class InheritedFd:
    """A file descriptor handed to a worker process when it starts.

    With `fork` the child inherits the number as is. With `spawn` and `forkserver`,
    pickling the process object (which happens inside `Process.start`) registers the fd
    with multiprocessing's launcher, which passes it to the child.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[object, tuple[object]]:
        return (_rebuild_inherited_fd, (reduction.DupFd(self.fd),))


def _rebuild_inherited_fd(dup: object) -> InheritedFd:
    return InheritedFd(dup.detach())  # type: ignore[attr-defined]
