"""The machine facts the engine reads: cores, memory, and the time threads wait for a CPU.

- `usable_cores()`: the CPUs this process may run on;
- `available_memory()`: bytes available without swapping, within a cgroup's limit, and
  `memory_budget()`: the share of it that AUTOTUNE's buffers (and the memory cache) may
  hold;
- the time queued for a CPU (runnable, not running), from Linux's `schedstat` (the second
  field of `/proc/<task>/schedstat`, in nanoseconds; elsewhere nothing is reported):
  `thread_queued_seconds()` for the calling thread, `process_queued_seconds()` for all the
  process's threads, and `thread_times_ns()`, the calling thread's CPU time and time queued
  read together, through a file descriptor kept open per thread: the debug layer reads it
  around every block and every 16th element of a stage, where opening the file each time
  (~10-20 us) would cost more than the work measured.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

__all__ = [
    "MEMORY_SHARE",
    "available_memory",
    "memory_budget",
    "process_queued_seconds",
    "thread_queued_seconds",
    "thread_times_ns",
    "usable_cores",
]

MEMORY_SHARE = 0.25
"""The share of the available memory that AUTOTUNE's buffers may hold (tf.data: 0.5 of
the budget it is given)."""

_THREAD_SCHEDSTAT = "/proc/thread-self/schedstat"


def usable_cores() -> int:
    """The CPUs this process may run on (`os.sched_getaffinity`, a container's cpuset),
    else `os.cpu_count()`."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_memory() -> int:
    """Bytes of memory available without swapping (Linux `MemAvailable`, bounded by a
    cgroup's limit); else half the physical memory."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        try:
            available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
        except (ValueError, OSError, AttributeError):
            available = 4 << 30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            available = min(available, int(text))
    return available


def memory_budget() -> int:
    """Bytes of arrays AUTOTUNE lets a reader compute ahead: `MEMORY_SHARE` of the
    available memory, at least 64 MiB."""
    return max(64 << 20, int(available_memory() * MEMORY_SHARE))


def _queued_ns(schedstat: bytes) -> int:
    """The time queued for a CPU, in nanoseconds, in the text of a `schedstat` file."""
    return int(schedstat.split()[1])


def thread_queued_seconds() -> float:
    """Seconds the calling thread has waited for a CPU (runnable, not running), 0.0 where
    Linux does not say: without it, a thread another process kept off the CPU looks idle.
    Opens the file on each call (~10-20 us): for callers that read it now and then."""
    try:
        with open(_THREAD_SCHEDSTAT, "rb") as f:
            return _queued_ns(f.read()) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def process_queued_seconds() -> float | None:
    """Seconds this process's threads have spent runnable, waiting for a CPU (the sum over
    `/proc/self/task/*/schedstat`); None where Linux does not say."""
    total = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat", "rb") as f:
                total += _queued_ns(f.read())
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


_sched = threading.local()
_libc: Any = None
_libc_lock = threading.Lock()


def _load_libc() -> Any:
    """libc's `pread`, called with the GIL held (False where it cannot be loaded)."""
    global _libc
    with _libc_lock:
        if _libc is None:
            try:
                import ctypes

                # PyDLL keeps the GIL during the call: os.pread would release it, and on a
                # loaded machine getting it back can take milliseconds, charged to the
                # stage measured.
                libc = ctypes.PyDLL(None)
                libc.pread.argtypes = [
                    ctypes.c_int,
                    ctypes.c_char_p,
                    ctypes.c_size_t,
                    ctypes.c_long,
                ]
                libc.pread.restype = ctypes.c_ssize_t
                _libc = libc
            except (OSError, AttributeError):
                _libc = False
        return _libc


class _ThreadSchedstat:
    """The calling thread's `/proc/thread-self/schedstat`, open while the thread lives: the
    thread-local that holds it is dropped when the thread ends, and the file is closed."""

    __slots__ = ("buf", "fd")

    def __init__(self) -> None:
        import ctypes

        try:
            self.fd = os.open(_THREAD_SCHEDSTAT, os.O_RDONLY) if _load_libc() else -1
        except OSError:
            self.fd = -1
        self.buf = ctypes.create_string_buffer(96)

    def __del__(self, _close: Any = os.close) -> None:  # os.close kept: also at exit
        if self.fd >= 0:
            _close(self.fd)
            self.fd = -1


def thread_times_ns() -> tuple[int, int]:
    """(on a CPU, queued for one): nanoseconds the calling thread has spent in each.

    Time queued for a CPU is neither work nor waiting for data: on a loaded machine it
    stretches every stage's wall time. The time on a CPU is the thread's CPU clock; the
    time queued is read with one `pread` of `/proc/thread-self/schedstat`, opened once per
    thread and closed when the thread ends (elsewhere: 0). For hot paths (~1 us a call)."""
    own = getattr(_sched, "file", None)
    if own is None:
        own = _sched.file = _ThreadSchedstat()
    if own.fd < 0:
        return time.thread_time_ns(), 0
    n = _libc.pread(own.fd, own.buf, 95, 0)
    queued = int(own.buf.raw[:n].split()[1]) if n > 0 else 0  # _queued_ns, inlined
    return time.thread_time_ns(), queued
