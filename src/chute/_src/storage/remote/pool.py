"""A small pool of threads for blocking remote work (opening objects, fsspec reads,
reading ahead), returning `concurrent.futures.Future`s.

`concurrent.futures.ThreadPoolExecutor` joins its threads before `atexit` hooks run, so
a read stalled on a silent server would hold the exit up until its deadline. These
threads are daemons, ended by an `atexit` hook instead: each finishes the work it holds
(a wait for a remote read ends at once when the main thread has ended: `loop.wait`) and
is joined, within `EXIT_JOIN_S`, so none is left running chute's code when the
interpreter finalizes. Work is only ever reads (nothing to flush), so dropping it at exit
loses nothing.

It is not the compute-ahead pool of `exec/threadpool.py` (the reader's threads,
interleave's): that one belongs to an iterator and joins its threads at exit, this one
is the process's, for blocking I/O, grows a thread for each piece of work waiting (a
burst of opens must not queue), is reset in a forked child, and the storage layer does
not import `exec/`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from chute._src import process_effects

__all__ = ["submit"]

T = TypeVar("T")
_THREADS = 32
EXIT_JOIN_S = 2.0
_Work = tuple[Future[Any], Callable[[], Any]] | None  # None: end the thread
_queue: queue.SimpleQueue[_Work] = queue.SimpleQueue()
_started: list[threading.Thread] = []
_threads = 0
_idle = 0
_waiting = 0  # work submitted and not yet taken by a thread
_lock = threading.Lock()


def _worker() -> None:
    global _idle, _waiting
    while True:
        work = _queue.get()
        if work is None:
            return
        fut, fn = work
        del work
        with _lock:
            _idle -= 1
            _waiting -= 1
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)
        del fut, fn
        with _lock:
            _idle += 1


def submit(fn: Callable[[], T]) -> Future[T]:
    """`fn()` run on one of the pool's daemon threads (up to 32; more wait their turn)."""
    global _threads, _idle, _waiting
    fut: Future[T] = Future()
    with _lock:
        # Each piece of work waiting has an idle thread to take it: work submitted in a
        # burst (a dataset opening 64 objects) before the idle threads woke would otherwise
        # queue behind one of them.
        if _idle <= _waiting and _threads < _THREADS:
            process_effects.register_once(
                "remote-pool", at_exit=_end_at_exit, after_in_child=_after_fork_in_child
            )
            _threads += 1
            _idle += 1
            thread = threading.Thread(target=_worker, name="chute-remote", daemon=True)
            thread.start()
            _started.append(thread)
        _waiting += 1
    _queue.put((fut, fn))
    return fut


def _end_at_exit() -> None:
    """Asks every thread to end once its work is done, and joins them (within
    `EXIT_JOIN_S` in all: a thread stuck in a call that never returns is left)."""
    global _threads, _idle
    with _lock:
        threads = list(_started)
        _started.clear()
        _threads = _idle = 0  # work submitted later (by a later hook) starts new threads
        for _ in threads:
            _queue.put(None)  # after the work queued: that is done first
    end = time.monotonic() + EXIT_JOIN_S
    for t in threads:
        t.join(timeout=max(0.0, end - time.monotonic()))


def _after_fork_in_child() -> None:
    global _queue, _threads, _idle, _waiting, _lock, _started
    _queue = queue.SimpleQueue()  # the parent's threads and their work are not here
    _threads = _idle = _waiting = 0
    _lock = threading.Lock()
    _started = []
