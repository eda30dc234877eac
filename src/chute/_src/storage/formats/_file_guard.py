"""Opening data files with errors that name them, and noticing files that shrink while open.

A memory-mapped file that is truncated while mapped makes every later access past the
new end fault with SIGBUS, which kills the process. Readers that map a file therefore
keep a descriptor (`FileGuard`) and, before reading, look at `guard.leased`:

- **Not leased (the default).** Once per `__getitem__`/`__getitems__` call the reader
  compares the file's size (`os.lseek(fd, 0, SEEK_END)`: one system call, about 0.5 us)
  with the size it had when opened (`check`): a file that shrank raises
  `chute.DataError`. It changes nothing in the process, so it is the default (Arrow and
  HF datasets map files with no protection at all). `benchmarks/bench_truncation.py`
  (results in `benchmarks/results/2026-12-07/`) measured, on a loaded 2-core VM where a
  system call costs 2.5-14 us: `__getitems__` blocks of 1,000 records and ArrayRecord
  `src[i]` cost the same as with a lease; a `.crec` `src[i]` alone 20-26 us against
  12-13 us leased. `pread` instead of the map (a short read, never a SIGBUS) was slower
  still for blocks (one call per record: 13.6-30 us against 9.8-14 us a record) and no
  faster than the lease for single reads, so chute keeps the map. What the size check
  leaves open: a truncation between the check and the copy out of the map (a few
  microseconds for `src[i]`, the whole block for `__getitems__`) still faults.
- **Leased (opt-in: `CHUTE_FILE_LEASES=1`, Linux).** The guard holds a read lease on the
  file (`fcntl(fd, F_SETLEASE, F_RDLCK)`). The kernel then makes any other opener for
  writing and any truncation, from any process, wait until the lease is released, and
  tells this process first with a real-time signal (`F_SETSIG`), sent to one thread
  (`F_SETOWN_EX`): the "chute-file-leases" daemon thread, which blocks that signal and
  waits for it with `sigwaitinfo`. On the signal it finds the guards whose lease is
  breaking (`F_GETLEASE` no longer says `F_RDLCK`), sets their `leased` to False, gives
  running reads a moment (1 ms) to finish, and releases the lease; only then does the
  writer proceed. A read therefore costs one attribute test while no writer comes. The
  signal handler, the thread and a fork hook are process-wide effects, which is why they
  are the user's choice (`chute._src.process_effects`). A guard whose lease was broken
  uses the size check for the rest of its life.

With the switch on, a guard is leased when all of these hold; otherwise it silently uses
the size check: Linux; a free real-time signal (handler `SIG_DFL`) was found, and a
no-op-safe Python handler installed on it, which happens on the first guard opened in the
main thread (so a process whose first files are opened in other threads leases only
later ones); the file is owned by this user (or the process has CAP_LEASE); nobody has
it open for writing (`EAGAIN`); the file system supports leases.
The thread runs only while some guard holds a lease and exits after the last is closed.

Across `fork`, a lease belongs to the open file description, which parent and child
share, and its signal goes to the parent's thread: the child therefore marks every
inherited guard as not leased (size checks) and never releases or re-takes those leases;
files it opens itself get leases of its own. Worker processes started with
forkserver or spawn unpickle sources and open the files again, so they lease their own.
`close()` releases the lease before closing (a mapping keeps a duplicate of the
descriptor, which would otherwise keep the lease alive).

Windows that remain (`docs/design.md`, "Storage", points here):
- A read that tested the flag and was then paused at a bytecode boundary, before its
  copy out of the map, for longer than the thread's 1 ms grace can still fault; for a
  block read with no lease, the window is the whole block.
- A writer waits for this process's lease thread, which needs the GIL: a process whose
  threads hold the GIL without releasing it (long C calls that do not release it), or a
  stopped process (SIGSTOP, a debugger), delays other processes' writers by as long, at
  most `/proc/sys/fs/lease-break-time` (45 s). After that the kernel breaks the lease
  itself, and a read that runs before the thread has marked the guard can fault.
- A process that truncates or opens for writing a file it is itself reading waits for
  its own lease thread (about a millisecond); from a thread holding the GIL in C code
  (not `os.truncate` or `open`, which release it), that wait is the 45 s above.
"""

from __future__ import annotations

import errno
import mmap
import os
import resource
import signal
import stat
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from chute._src import process_effects
from chute._src.core.errors import DataError

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
    elif e.errno == errno.EMFILE:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        why = (
            f"too many open files in this process (RLIMIT_NOFILE {soft})",
            "raise the limit (`ulimit -n`, or resource.setrlimit(resource.RLIMIT_NOFILE, "
            "...) in your program), or read fewer files at once",
        )
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


# fcntl commands (Linux, <fcntl.h>); the fcntl module names only some of them.
_F_SETSIG = 10
_F_GETSIG = 11
_F_SETOWN_EX = 15
_F_GETOWN_EX = 16
_F_OWNER_TID = 0
_F_SETLEASE = 1024
_F_GETLEASE = 1025
_F_RDLCK = 0
_F_UNLCK = 2
_GRACE_S = 0.001  # lets a read that passed its flag test finish before the writer goes on


def _leases_wanted() -> bool:
    return process_effects.file_leases_on()


def _on_signal(signum: int, frame: Any) -> None:
    """The Python handler: only a signal that reached the process, not the thread."""
    _LEASES.serve_breaks()


class _Leases:
    """This process's lease signal, the thread that answers it, and the leased guards."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.guards: weakref.WeakSet[FileGuard] = weakref.WeakSet()
        self.sig = 0  # the real-time signal; 0 until chosen
        self.unusable = False  # no free signal or no sigwaitinfo: never try again
        self.thread: threading.Thread | None = None
        self.tid = 0  # the thread's kernel id, for F_SETOWN_EX

    def _choose_signal(self) -> bool:
        """Installs `_on_signal` on a free real-time signal (main thread only)."""
        if self.sig:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False  # a Python handler can only be installed from the main thread
        if not hasattr(signal, "sigwaitinfo"):
            self.unusable = True
            return False
        self.sig = process_effects.claim_realtime_signal(_on_signal, signal.SIGRTMIN + 6)
        if not self.sig:
            self.unusable = True
            return False
        # The parent's leases live on descriptions a forked child shares; the hook makes
        # the child leave them alone. Registered only once leases are in use.
        process_effects.register_at_fork_once(
            "chute-file-leases",
            before=lambda: _LEASES.lock.acquire(),
            after_in_parent=lambda: _LEASES.lock.release(),
            after_in_child=_LEASES.after_fork_in_child,
        )
        return True

    def _start_thread(self) -> None:
        ready = threading.Event()
        t = threading.Thread(
            target=self._serve, args=(ready,), name="chute-file-leases", daemon=True
        )
        t.start()
        ready.wait()
        self.thread = t

    def _serve(self, ready: threading.Event) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, [self.sig])
        self.tid = threading.get_native_id()
        ready.set()
        me = threading.current_thread()
        while True:
            signal.sigwaitinfo([self.sig])
            with self.lock:
                self.serve_breaks()
                if not self.guards and self.thread is me:
                    self.thread = None
                    return

    def serve_breaks(self) -> None:
        """Unmarks every guard whose lease is breaking, then releases those leases."""
        with self.lock:
            breaking = []
            for g in list(self.guards):
                if g.leased:
                    try:
                        state = fcntl(g.fd, _F_GETLEASE)
                    except OSError:
                        state = _F_UNLCK
                    if state != _F_RDLCK:
                        g.leased = False  # later reads check the size
                        breaking.append(g)
            if breaking:
                time.sleep(_GRACE_S)
                for g in breaking:
                    g.release_lease()

    def take(self, guard: FileGuard) -> bool:
        """Takes a read lease on `guard.fd` if this process can; True if it did."""
        if self.unusable or not _leases_wanted():  # read each time: it can be changed
            return False
        with self.lock:
            if not self._choose_signal():
                return False
            if self.thread is None:
                self._start_thread()
            fd, tid = guard.fd, self.tid
            try:
                fcntl(fd, _F_SETSIG, self.sig)
                fcntl(fd, _F_SETOWN_EX, struct.pack("ii", _F_OWNER_TID, tid))
                fcntl(fd, _F_SETLEASE, _F_RDLCK)
            except OSError:  # EAGAIN: open for writing; EACCES: not ours; EINVAL: no leases
                self.wake_if_idle()
                return False
            try:
                owner = struct.unpack("ii", fcntl(fd, _F_GETOWN_EX, bytes(8)))
                ok = owner == (_F_OWNER_TID, tid) and fcntl(fd, _F_GETSIG) == self.sig
                ok = ok and fcntl(fd, _F_GETLEASE) == _F_RDLCK  # not breaking already
                # The size read before the lease must still hold now that writers wait.
                ok = ok and os.lseek(fd, 0, SEEK_END) >= guard.size
            except OSError:  # pragma: no cover - these do not fail on an open fd
                ok = False
            if not ok:
                fcntl(fd, _F_SETLEASE, _F_UNLCK)
                self.wake_if_idle()
                return False
            self.guards.add(guard)
            return True

    def wake_if_idle(self) -> None:
        """Lets the thread exit once no guard holds a lease (it checks on waking)."""
        t = self.thread
        if t is not None and not self.guards and t.ident is not None:
            signal.pthread_kill(t.ident, self.sig)

    def after_fork_in_child(self) -> None:
        # The parent's leases live on descriptions shared with it and signal its thread.
        for g in list(self.guards):
            g.leased = False
            g.owns_lease = False
        self.guards = weakref.WeakSet()
        self.lock = threading.RLock()
        self.thread = None
        self.tid = 0


if sys.platform == "linux":
    from fcntl import fcntl

    _LEASES = _Leases()
else:  # pragma: no cover - leases are Linux's

    def fcntl(fd: int, cmd: int, arg: Any = 0) -> Any:
        raise OSError(errno.ENOSYS, "no file leases")

    _LEASES = _Leases()
    _LEASES.unusable = True


class FileGuard:
    """An open read-only descriptor on `path`, the file's size when opened, and a lease.

    Raises `DataError` naming `path` (with the OSError as `__cause__`) when the path is
    missing, a directory, unreadable or not a regular file, or when the process has run
    out of descriptors (a chute worker first raises its own soft limit to the hard one).

    `leased` is True while a read lease (`CHUTE_FILE_LEASES=1`) guarantees that the file
    cannot shrink without this process noticing first; readers then skip the size check:
    `if not guard.leased`
    then `check()` (see the module docstring). `lease=False` never takes one (for a
    guard opened only to probe a file).
    """

    __slots__ = ("__weakref__", "fd", "leased", "owns_lease", "path", "size", "what")

    def __init__(self, path: str, what: str, *, lease: bool = True) -> None:
        self.path = path
        self.what = what
        self.fd = -1
        self.leased = False
        self.owns_lease = False
        try:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                # A chute worker raises its own limit; the user's process is left as is.
                if e.errno != errno.EMFILE or not process_effects.raise_fd_limit():
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
        if lease and _LEASES.take(self):
            self.owns_lease = True
            self.leased = True

    def check(self, record: int | None = None) -> None:
        """Raises DataError if the file is now shorter than when it was opened.

        Costs one attribute test while the file is leased, one `lseek` otherwise.
        """
        if self.leased:
            return
        now = os.lseek(self.fd, 0, SEEK_END)
        if now < self.size:
            raise shrunk_error(self.path, now, self.size, record)

    def check_once(self, checked: set[int], record: int | None = None) -> None:
        """`check(record)` in a block of reads: once per guard (`checked` holds the ids of
        the guards the block has checked), and not at all while leased."""
        if not self.leased and id(self) not in checked:
            self.check(record)
            checked.add(id(self))

    def mapping(self) -> mmap.mmap:
        """The file mapped read-only (readers slice it for bytes). A map holds a duplicate
        of the descriptor: a process out of descriptors gets the `DataError` of `open`."""
        try:
            return mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
        except OSError as e:
            if e.errno != errno.EMFILE:
                raise
            if not process_effects.raise_fd_limit():  # a chute worker raises its own limit
                raise open_error(self.path, e, self.what) from e
        return mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)

    def explain(self, err: DataError) -> DataError:
        """`err` for a read that failed its checks (a remote file may say why instead)."""
        return err

    def error(self, record: int | None = None) -> DataError:
        """The DataError for a file found shorter than when opened."""
        return shrunk_error(self.path, os.lseek(self.fd, 0, SEEK_END), self.size, record)

    def release_lease(self) -> None:
        """Gives up the lease (the size check takes over); the caller holds the lock."""
        self.leased = False
        if self.owns_lease:
            self.owns_lease = False
            _LEASES.guards.discard(self)
            try:
                fcntl(self.fd, _F_SETLEASE, _F_UNLCK)
            except OSError:  # pragma: no cover - the lease was already gone
                pass

    def close(self) -> None:
        if self.owns_lease:
            with _LEASES.lock:
                self.release_lease()
            _LEASES.wake_if_idle()
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # A guard that lives until the interpreter tears its modules down (held by a
        # module, or by `sys`) is collected after this module's globals are gone:
        # `_finalizing` is bound here so that no global is looked up then, and the kernel
        # closes the descriptor (and drops its lease) as the process ends.
        if _finalizing():
            return
        if getattr(self, "fd", -1) >= 0:
            self.close()
