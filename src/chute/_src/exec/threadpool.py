"""`ComputePool`: the threads that compute ahead of the consumer, for one iterator.

Used by the reader's `Threads` executor (`executors.py`: chunks of consecutive indices)
and by `InterleaveIterDataset` (`ops/interleave.py`: one read in flight per input). Both
need the same things of a pool, and get them here:

- started at the first submit (an iterator that is never read starts no thread);
- resized while running (AUTOTUNE): the work running or queued on the old threads
  finishes there, new work goes to the new ones;
- released on demand, or when the pool is dropped with its iterator: work not started
  is cancelled, threads end once idle, and the consumer never waits for them;
- futures that the consumer takes in its own order (a chunk or an input at a time), so
  the output order never depends on the threads.

The threads are `concurrent.futures.ThreadPoolExecutor`'s: an element being computed
when the interpreter exits is finished (work not started is cancelled by the release).

chute has one other pool, `storage/remote/pool.py`, the process's for blocking remote
I/O (opens, fsspec reads). It is not this one: its threads are daemons joined by an
`atexit` hook within 2 s (a read stalled on a silent server must not hold up the exit),
while these are joined before it (a daemon thread coming back from native code, a Rust
tokenizer say, after finalization began is ended by `pthread_exit`, which aborts through
Rust or C++ frames); it is shared by the whole process and reset
in a forked child, this one belongs to an iterator; and storage does not import `exec/`.

The other threads of chute are one each, for a reason of its own:

- `exec/thread_prefetch.py`: runs a parent iterator, which cannot be split across threads
  (each element needs the previous one's state); one queue hand-over per element.
- `exec/workers/startup.py`: the first element, and the runs of elements computed while
  the first workers start, on daemon threads an element that hangs may be abandoned on
  (the workers compute it instead): a pool's thread would hold up the exit.
- `exec/workers/service.py`: starts the worker processes (`iter()` does not wait for the
  forkserver's imports).
- `exec/mp/_worker.py`: in each worker, receives tasks while the worker computes.
- `exec/ray/fetch.py`: pulls finished results from Ray's object store ahead of the reader.
- `storage/remote/loop.py`: the event loop on which obstore's futures complete.
- `storage/formats/_file_guard.py`: with `CHUTE_FILE_LEASES=1`, waits for the signal that
  another process is about to write or truncate a mapped file.
- `debug/instrument.py`: the debug layer's GIL sampler (only in debug mode).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

T = TypeVar("T")


class ComputePool:
    """Up to `threads` threads named `name-N`, started at the first `submit`."""

    __slots__ = ("__weakref__", "_executor", "_finalizer", "name", "threads")

    def __init__(self, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError(f"ComputePool({name!r}): threads={threads} must be at least 1.")
        self.threads = threads
        self.name = name
        self._executor: futures.ThreadPoolExecutor | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def started(self) -> bool:
        """Whether threads were started since the last release or resize."""
        return self._executor is not None

    def submit(self, fn: Callable[..., T], *args: Any) -> futures.Future[T]:
        executor = self._executor
        if executor is None:
            executor = futures.ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
            # Dropping the pool (with its iterator) cancels the work not started.
            self._finalizer = weakref.finalize(self, _shutdown, executor, True)
            self._executor = executor
        return executor.submit(fn, *args)

    def resize(self, threads: int) -> None:
        """Computes on `threads` threads from now on; work submitted before finishes (or
        is cancelled by its owner) on the threads it was given to."""
        if threads < 1:
            raise ValueError(f"ComputePool({self.name!r}): threads={threads} must be at least 1.")
        if threads != self.threads:
            self.threads = threads
            self._drop(cancel=False)

    def release(self) -> None:
        """Cancels the work not started; the threads end once idle. The pool still works
        after it: the next `submit` starts threads again."""
        self._drop(cancel=True)

    def _drop(self, cancel: bool) -> None:
        executor, finalizer = self._executor, self._finalizer
        self._executor = self._finalizer = None
        if finalizer is not None:
            finalizer.detach()
        if executor is not None:
            _shutdown(executor, cancel)


def _shutdown(executor: futures.ThreadPoolExecutor, cancel: bool) -> None:
    executor.shutdown(wait=False, cancel_futures=cancel)
