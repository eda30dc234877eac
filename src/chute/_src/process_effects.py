"""Every change chute makes to a process as a whole, and the switch of each.

chute runs inside processes it does not own: a trainer, a notebook, a Ray actor, a test
runner. In such a process (the user's) chute leaves everything as found: it installs no
signal handler, takes no file lease, tunes no allocator, changes no rlimit and replaces
nothing in `multiprocessing` or `threading`, unless the user turns one of the switches
below on; the hooks of remote reading are registered only once a URL is read. chute's own worker processes (started by
`chute._src.exec.mp`, named `chute-worker-...`) belong to chute and tune themselves.

What remains, all here or called from here:

| effect | process | switch | why |
| --- | --- | --- | --- |
| glibc `mallopt` (mmap threshold 32 MiB, trim 128 MiB) | chute's workers | none | freed blocks reused: elements of 256 KiB-8 MiB arrays 1.5x faster, a third of the page faults (`benchmarks/bench_worker_heap.py`, results/2026-12-07); `tests/exec/test_mp_heap.py` |
| `RLIMIT_NOFILE` soft limit raised to the hard one, on `EMFILE` only | chute's workers | none | a worker holds every shard it reads open; in the user's process `EMFILE` is an error that says how to raise the limit |
| file read leases: a handler on a free real-time signal, a thread that answers it, a fork hook | any process that opens a local `.crec`/ArrayRecord/`.npy`/JSONL/TFRecord file | `CHUTE_FILE_LEASES=1` (off by default) | `benchmarks/bench_truncation.py`: `__getitems__` blocks and ArrayRecord reads cost the same with the size check; a lone `.crec` `src[i]` about 1.6-2.1x on a VM where a system call costs microseconds |
| remote reads: `atexit` hooks (the event loop's, the thread pool's) and fork hooks that reset chute's own remote state (stores, block cache, loop, pool) in a forked child | a process that reads a URL, from its first read | reading no URL | without the exit hook `chute inspect s3://...` aborted at exit in 6 of 50 runs (`tests/storage/test_remote_exit.py`, `storage/remote/loop.py`); a forked child cannot use its parent's connections, threads or locks |

Workers' native thread pools (`OMP_NUM_THREADS=1`, ...) are set in the workers' own
environment (`exec/mp/_server_init.py`), never in the user's. Workers start from chute's
own forkserver and process classes (`exec/mp/forkserver.py`), not the process-wide ones.
"""

from __future__ import annotations

import atexit
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "LEASES_SWITCH",
    "claim_realtime_signal",
    "enter_worker",
    "file_leases_on",
    "in_worker",
    "raise_fd_limit",
    "register_at_fork_once",
    "register_once",
]

LEASES_SWITCH = "CHUTE_FILE_LEASES"
_ON = ("1", "on", "true", "yes")
_OFF = ("", "0", "off", "false", "no")

_in_worker = False
_registered: set[str] = set()
_lock = threading.Lock()


def enter_worker() -> None:
    """Marks this process as one of chute's workers, which may then tune itself (the
    worker's entry point next tunes its allocator: `exec/mp/heap.py`). Called first thing
    by the worker's entry point."""
    global _in_worker
    _in_worker = True


def in_worker() -> bool:
    """Whether this process is one of chute's workers (which may tune itself)."""
    return _in_worker


def raise_fd_limit() -> bool:
    """In a chute worker, raises the soft limit on open files to the hard one; True if it
    grew. In any other process it changes nothing and returns False."""
    if not _in_worker:
        return False
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return True


def file_leases_on() -> bool:
    """Whether the user asked for file read leases (`CHUTE_FILE_LEASES=1`; Linux only).

    Read each time a file is opened, so it can be changed while the process runs. A value
    that is neither on nor off raises ValueError naming it."""
    value = os.environ.get(LEASES_SWITCH, "").strip().lower()
    if value in _OFF:
        return False
    if value not in _ON:
        raise ValueError(
            f"{LEASES_SWITCH}={os.environ[LEASES_SWITCH]!r} is neither on nor off: set it to "
            "1 to have chute take read leases on the local files it maps, to 0 or unset it "
            "to leave them (the default)"
        )
    return sys.platform == "linux"


def claim_realtime_signal(handler: Callable[[int, Any], None], first: int) -> int:
    """Installs `handler` on the first real-time signal from `first` whose handler is
    `SIG_DFL` (no one uses it) and returns it; 0 if none is free or this is not the main
    thread (only the main thread can install a handler). For file leases only, when they
    are switched on."""
    if threading.current_thread() is not threading.main_thread():
        return 0
    for sig in range(first, signal.SIGRTMAX - 1):
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, handler)
            return sig
    return 0


def register_at_fork_once(
    key: str,
    *,
    before: Callable[[], object],
    after_in_parent: Callable[[], object],
    after_in_child: Callable[[], object],
) -> None:
    """`os.register_at_fork` for the hooks named `key`, once per process (hooks cannot be
    unregistered, so only a switched-on effect registers any)."""
    register_once(
        key, before=before, after_in_parent=after_in_parent, after_in_child=after_in_child
    )


def register_once(
    key: str,
    *,
    at_exit: Callable[[], object] | None = None,
    before: Callable[[], object] | None = None,
    after_in_parent: Callable[[], object] | None = None,
    after_in_child: Callable[[], object] | None = None,
) -> None:
    """Registers the hooks named `key` (an `atexit` hook, fork hooks) once per process, at
    the first use of what needs them: neither kind can be unregistered."""
    with _lock:
        if key in _registered:
            return
        _registered.add(key)
    if at_exit is not None:
        atexit.register(at_exit)
    hooks = {"before": before, "after_in_parent": after_in_parent, "after_in_child": after_in_child}
    given = {when: hook for when, hook in hooks.items() if hook is not None}
    if given:
        os.register_at_fork(**given)
