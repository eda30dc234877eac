"""The code that runs in a worker process. Imports only the standard library (and numpy
once a worker has a slab).

A worker has two threads. The receiving thread reads the pipe from the main process:
tasks go to a queue, freed region ids go straight to the sender's allocator, and a stop
frame (or the pipe closing, or the parent process disappearing) ends the worker. The main
thread runs `worker_init_fn` once, then each task in order, and sends each result back.

On SIGUSR1 a worker writes the Python stack of all its threads (`faulthandler`, so even a
thread stuck in C code or holding the GIL is shown) to its stack pipe, which the main
process reads when a worker has produced nothing for a while (`WorkerPool.stack`). It
writes `STACK_READY` there first, once the handler is installed: before that, SIGUSR1
would kill it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from queue import SimpleQueue
from typing import Any

from chute._src import process_effects
from chute._src.core import shm_files
from chute._src.exec.mp import _server_init
from chute._src.exec.mp.slabs import InheritedFd, map_slab
from chute._src.exec.mp.transport import ResultSender, decode_free

__all__ = ["WorkerSpec", "run_worker"]

# Exit code of a worker whose main process went away without closing the pool.
EXIT_ORPHANED = 3
WORKER_NAME_PREFIX = "chute-worker-"
# Written to the stack pipe once SIGUSR1 dumps the stack instead of killing the worker.
STACK_READY = b"\x00"
_PR_SET_PDEATHSIG = 1
_WATCHDOG_SECONDS = 0.5


def _in_a_worker_being_started() -> bool:
    from multiprocessing import current_process

    return current_process().name.startswith(WORKER_NAME_PREFIX)


# A spawned worker imports this module to unpickle its spec, before numpy: its native
# thread counts are set here, in its own environment (a forked one inherits the server's).
if _in_a_worker_being_started():
    _server_init.apply_thread_defaults()


@dataclass
class WorkerSpec:
    """Everything one worker process needs; pickled into it at start."""

    index: int
    num_workers: int
    worker_fn: bytes  # pickled `Callable[[int, int, Any], Any]`
    worker_init_fn: bytes | None  # pickled `Callable[[int, int], None]`
    conn: Connection
    slab: InheritedFd | None
    stack: InheritedFd | None
    handed: tuple[tuple[str, InheritedFd], ...]  # shared files `worker_fn` refers to
    slab_bytes: int
    grow_to: int
    shm_dir: str
    headroom: int
    min_shared_bytes: int
    pdeathsig: bool


def _die_with_parent() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _dump_stack_on_sigusr1(fd: int) -> None:
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=fd, all_threads=True, chain=False)
    os.write(fd, STACK_READY)


def _receive(conn: Connection, tasks: SimpleQueue[bytes | None], sender: ResultSender) -> None:
    # SIGUSR1 goes to the main thread, so faulthandler's "Current thread" is the task's.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    parent = os.getppid()
    while True:
        try:
            if not conn.poll(_WATCHDOG_SECONDS):
                if os.getppid() != parent:
                    os._exit(EXIT_ORPHANED)
                continue
            frame = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(EXIT_ORPHANED)  # the main process closed the pipe or died
        tag = frame[:1]
        if tag == b"T":
            tasks.put(frame)
        elif tag == b"F":
            sender.freed.extend(decode_free(frame))
        else:
            tasks.put(None)
            return


def run_worker(spec: WorkerSpec) -> None:
    """The worker process's entry point."""
    import pickle

    # Ctrl-C reaches the whole process group; the main process handles it and closes us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if spec.pdeathsig:
        _die_with_parent()
    if spec.stack is not None:
        _dump_stack_on_sigusr1(spec.stack.fd)
    process_effects.enter_worker()  # a worker tunes itself: the fd limit, its allocator
    from chute._src.exec.mp import heap  # (not in the process that forks workers)

    heap.keep_freed_memory()
    # Before `worker_fn` is unpickled: the shared files in it look their descriptors up.
    shm_files.receive({key: inherited.fd for key, inherited in spec.handed})
    slab = None
    if spec.slab is not None:
        slab = map_slab(spec.slab.fd, spec.slab_bytes)
        os.close(spec.slab.fd)
    conn = spec.conn
    sender = ResultSender(
        conn,
        slab,
        spec.min_shared_bytes,
        grow_to=spec.grow_to,
        shm_dir=spec.shm_dir,
        headroom=spec.headroom,
    )
    if slab is not None:
        from chute._src.core import outbuf  # imports numpy, which the forkserver preloads

        outbuf.install(sender.allocate_array)  # large arrays stages build go to the slab
    tasks: SimpleQueue[bytes | None] = SimpleQueue()
    threading.Thread(
        target=_receive, args=(conn, tasks, sender), name="chute-receive", daemon=True
    ).start()
    index, count = spec.index, spec.num_workers
    from chute._src.core import process

    process.set_worker_count(count)  # what sizes a resource per process reads it
    try:
        worker_fn: Callable[[int, int, Any], Any]
        try:
            worker_fn = pickle.loads(spec.worker_fn)
            if spec.worker_init_fn is not None:
                pickle.loads(spec.worker_init_fn)(index, count)
        except BaseException as e:
            sender.send_error(-1, _exit_as_error(e, "worker_init_fn"))
            while tasks.get() is not None:
                pass  # the main process closes the pool on this error
            return
        prepare = getattr(worker_fn, "prepare", None)
        if prepare is not None:
            prepare()  # e.g. unpickle and import what the tasks need, before the first
        while (frame := tasks.get()) is not None:
            seq = int.from_bytes(frame[1:9], "little")
            try:
                result = worker_fn(index, count, pickle.loads(frame[9:]))
            except BaseException as e:
                sender.send_error(seq, _exit_as_error(e, "a task"))
                continue
            try:
                sender.send_result(seq, result)
            except (BrokenPipeError, ConnectionError):
                raise
            except BaseException as e:
                _send_unpicklable(sender, seq, worker_fn, frame, result, e)
            del result
    except (BrokenPipeError, ConnectionError):
        pass  # the main process closed the pool while we were sending


def _exit_as_error(exc: BaseException, what: str) -> BaseException:
    """A `sys.exit()` in a worker reaches the main process as a RuntimeError naming the
    exit code (as Grain's dead worker does), never as a SystemExit that would end it."""
    if not isinstance(exc, SystemExit):
        return exc
    error = RuntimeError(
        f"chute: {what} called sys.exit() in a worker process with exit code "
        f"{exc.code!r}; raise an exception instead."
    )
    error.__cause__ = exc
    return error


def _send_unpicklable(
    sender: ResultSender,
    seq: int,
    worker_fn: Callable[[int, int, Any], Any],
    frame: bytes,
    result: object,
    exc: BaseException,
) -> None:
    """Reports a result that cannot be pickled.

    A `worker_fn` with a `not_picklable(task, result, exc)` method may say what to send
    instead (`mp_prefetch` sends the elements before the one that cannot be pickled, and
    an error naming that element); otherwise the error goes back with a note.
    """
    import pickle

    replace = getattr(worker_fn, "not_picklable", None)
    if replace is not None:
        try:
            sender.send_result(seq, replace(pickle.loads(frame[9:]), result, exc))
            return
        except (BrokenPipeError, ConnectionError):
            raise
        except BaseException as e:
            exc = e
    exc.add_note(
        "chute: the worker could not pickle the result of this task to send it back; "
        "return picklable values (no lambdas, open files or locks)"
    )
    sender.send_error(seq, exc)
