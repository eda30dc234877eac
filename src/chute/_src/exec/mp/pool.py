"""`WorkerPool`: worker processes that run `worker_fn` on tasks and return results in order.

The caller assigns every task to a worker (`put(worker_index, task)`) and reads each
worker's results back in the order its tasks were put (`get(worker_index)`). Nothing in
the pool decides which worker does what, so a caller that numbers its tasks and sends
task k to worker k % W gets output that does not depend on timing.

Example, with the builtin `max` as a (picklable) `worker_fn`:

>>> with WorkerPool(2, max) as pool:
...     pool.put(1, 7)  # worker 1 runs max(1, 2, 7)
...     pool.get(1)
7
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Generic, NoReturn, TypeVar

from chute._src.core.shm_files import sweep_left_behind
from chute._src.exec.mp import forkserver
from chute._src.exec.mp._worker import (
    STACK_READY,
    WORKER_NAME_PREFIX,
    WorkerSpec,
    run_worker,
)
from chute._src.exec.mp.errors import (
    NotPicklableError,
    PoolClosedError,
    PoolUsageError,
    SharedMemoryWarning,
    WorkerDiedError,
    WorkerError,
)
from chute._src.exec.mp.forkserver import DEFAULT_START_METHOD
from chute._src.exec.mp.slabs import (
    DEFAULT_SHM_DIR,
    InheritedFd,
    create_slab_fd,
    map_slab,
    plan_slabs,
)
from chute._src.exec.mp.transport import (
    DEFAULT_MIN_SHARED_BYTES,
    RemoteFailure,
    ResultReceiver,
    encode_free,
)

__all__ = ["DEFAULT_START_METHOD", "WorkerPool"]

TaskT = TypeVar("TaskT")
ResultT = TypeVar("ResultT")

# By default a worker's slab starts small (start-up is quick) and grows to fit
# buffer_size + 2 of its results, up to 1 GiB or a fair share of the free space.
DEFAULT_INITIAL_SHM_BYTES = 16 << 20
DEFAULT_SHM_LIMIT_BYTES = 1 << 30
# How long `close` waits for workers to finish their current task before terminating them.
CLOSE_GRACE_SECONDS = 1.0


def _pickled(what: str, obj: object) -> bytes:
    """`obj` pickled for the workers: by value where it lives in `__main__` (cloudpickle,
    as workers never import the main script), by reference otherwise."""
    from chute._src.exec.mp import by_value

    try:
        return by_value.dumps(obj)
    except Exception as e:
        raise NotPicklableError(
            f"{what} {obj!r} cannot be pickled, so it cannot be sent to worker processes "
            f"({type(e).__name__}: {e}). Make the objects it holds picklable (open files, "
            "locks and sockets are not: open them lazily in the worker)."
        ) from e


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped responding"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = (
            " (SIGKILL usually means the out-of-memory killer: see `dmesg`; use fewer "
            "workers or less memory per task)"
            if -exitcode == signal.SIGKILL
            else ""
        )
        return f"was killed by {name}{hint}"
    return f"exited with code {exitcode}"


class _Worker:
    """The main process's handle on one worker."""

    def __init__(
        self, process: BaseProcess, conn: Connection, receiver: ResultReceiver, stack_fd: int
    ) -> None:
        self.process = process
        self.conn = conn
        self.receiver = receiver
        self.pending: deque[tuple[int, object]] = deque()  # (seq, task), oldest first
        self.next_seq = 0
        self.stack_fd = stack_fd  # read end of the pipe the worker dumps its stack into
        self.stack_ready = False  # the worker has said SIGUSR1 no longer kills it

    def read_stack_pipe(self, wait: float, quiet: float, until: bytes = b"") -> bytes:
        """What the worker wrote to its stack pipe: waits up to `wait` s for the first
        bytes, and for `until` to appear, then reads until none come for `quiet` s.

        A dump is written thread by thread; a busy machine may pause the worker between
        two threads for longer than `quiet`, so `until` (the header of the thread the
        signal interrupted, which `faulthandler` writes last) marks one not finished yet.
        """
        chunks: list[bytes] = []
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            done = chunks and until in b"".join(chunks)
            timeout = quiet if done else max(left, 0.0)
            if not select.select([self.stack_fd], [], [], timeout)[0]:
                if done or left <= 0:
                    break
                continue
            try:
                data = os.read(self.stack_fd, 1 << 16)
            except BlockingIOError:
                continue
            if not data:  # the worker is gone
                break
            chunks.append(data)
        out = b"".join(chunks)
        if not self.stack_ready and out.startswith(STACK_READY):
            self.stack_ready = True
            out = out[len(STACK_READY) :]
        return out

    def flush_frees(self) -> None:
        freed = self.receiver.freed
        if freed:
            ids = [freed.popleft() for _ in range(len(freed))]
            self.conn.send_bytes(encode_free(ids))


class _PoolState:
    """Everything the pool owns. Kept apart from `WorkerPool` so a finalizer can close it."""

    def __init__(self) -> None:
        self.workers: list[_Worker] = []
        self.closed = False
        self.closed_reason = "it was closed"

    def close(self, grace: float = CLOSE_GRACE_SECONDS) -> None:
        if self.closed:
            return
        self.closed = True
        # Workers whose start failed (or never came) have no process to stop.
        for w in [w for w in self.workers if w.process.pid is None]:
            w.conn.close()
            os.close(w.stack_fd)
        self.workers = [w for w in self.workers if w.process.pid is not None]
        for w in self.workers:
            with contextlib.suppress(OSError):  # already dead
                w.conn.send_bytes(b"S")
        deadline = time.monotonic() + grace
        for w in self.workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self.workers:
            if w.process.exitcode is None:
                w.process.terminate()
        for w in self.workers:
            w.process.join(1.0)
            if w.process.exitcode is None:
                w.process.kill()
                w.process.join()
        for w in self.workers:
            w.conn.close()
            w.process.close()
            os.close(w.stack_fd)
        self.workers = []


class WorkerPool(Generic[TaskT, ResultT]):
    """`num_workers` processes, each running `worker_fn(worker_index, num_workers, task)`.

    Use it from one thread at a time: `mp_prefetch`'s `ChunkService`, whose readers may
    run on threads of their own, holds a lock around every call. It starts no threads.

    Args:
      num_workers: how many worker processes to start.
      worker_fn: called in a worker for each task; must be picklable (checked here,
        before any process starts). Its result can be any picklable tree; numpy arrays in
        it come back as zero-copy views into shared memory. If it has a method
        `not_picklable(task, result, exc)`, a result that cannot be pickled is replaced by
        what that returns (to name the part that cannot). If it has a method `prepare()`,
        each worker calls it once as it starts, before waiting for a task.
      worker_init_fn: called once in each worker as `worker_init_fn(index, num_workers)`
        before its first task.
      buffer_size: how many tasks may be outstanding per worker (put but not yet got).
      start_method: "forkserver" (default), "spawn" or "fork"; see DEFAULT_START_METHOD.
      shm_bytes_per_worker: a fixed size for each worker's shared-memory slab. Results
        that do not fit in the free part of it are sent through a pipe instead (slower,
        never wrong). By default a slab starts at 16 MiB and grows to hold
        `buffer_size + 2` results, up to 1 GiB or half the free space shared by the
        workers. 0 disables shared memory.
      shm_dir: the tmpfs directory to allocate shared memory in.
      min_shared_bytes: arrays smaller than this travel inside the pickle.
      handed_fds: the descriptors, by key, of the shared files `worker_fn`'s pickle
        refers to (collected by `core.shm_files.handing_over` as it was pickled); each
        worker receives them as it starts. The caller keeps them open until `start()`
        has returned.
    """

    def __init__(
        self,
        num_workers: int,
        worker_fn: Callable[[int, int, TaskT], ResultT],
        *,
        worker_init_fn: Callable[[int, int], None] | None = None,
        buffer_size: int = 2,
        start_method: str = DEFAULT_START_METHOD,
        shm_bytes_per_worker: int | None = None,
        shm_dir: str = DEFAULT_SHM_DIR,
        min_shared_bytes: int = DEFAULT_MIN_SHARED_BYTES,
        handed_fds: Mapping[str, int] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers!r} must be at least 1.")
        if buffer_size < 1:
            raise ValueError(f"buffer_size={buffer_size!r} must be at least 1.")
        methods = multiprocessing.get_all_start_methods()
        if start_method not in methods:
            raise ValueError(f"start_method={start_method!r} is not one of {methods}.")
        if shm_bytes_per_worker is not None and shm_bytes_per_worker < 0:
            raise ValueError(f"shm_bytes_per_worker={shm_bytes_per_worker!r} must be >= 0.")
        self._worker_fn_pickle = _pickled("worker_fn", worker_fn)
        if worker_init_fn is not None:
            self._worker_init_fn_pickle: bytes | None = _pickled("worker_init_fn", worker_init_fn)
        else:
            self._worker_init_fn_pickle = None
        self._num_workers = num_workers
        self._worker_fn = worker_fn
        self._worker_init_fn = worker_init_fn
        self._buffer_size = buffer_size
        self._start_method = start_method
        self._shm_request = shm_bytes_per_worker
        self._shm_dir = shm_dir
        self._min_shared_bytes = min_shared_bytes
        self._handed_fds = dict(handed_fds or {})
        self._shm_bytes = 0
        self._shm_limit = 0
        self._started = False
        self._state = _PoolState()
        self._finalizer = weakref.finalize(self, self._state.close)

    @property
    def num_workers(self) -> int:
        return self._num_workers

    @property
    def start_method(self) -> str:
        return self._start_method

    @property
    def shm_bytes_per_worker(self) -> int:
        """The size of each worker's first slab once started; 0: results use pipes."""
        return self._shm_bytes

    def slab_bytes(self, worker_index: int) -> int:
        """The size of worker `worker_index`'s current slab (it grows with its results)."""
        return self._worker(worker_index).receiver.slab_bytes

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._state.workers if w.process.pid is not None]

    @property
    def closed(self) -> bool:
        return self._state.closed

    def outstanding(self, worker_index: int) -> int:
        """How many tasks were put to this worker and not yet got."""
        return len(self._worker(worker_index).pending)

    def ready(self, worker_index: int) -> bool:
        """Whether `get(worker_index)` would find a message waiting from a live worker
        (so returns at once, unless the message only announces a new slab)."""
        w = self._worker(worker_index)
        return bool(w.pending) and w.conn.poll(0) and w.process.is_alive()

    def start(self) -> None:
        """Starts every worker (all at once). Called by the first `put` if not before."""
        if self._started:
            return
        self._check_open()
        self._started = True
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _allocate_slabs(self) -> list[int]:
        n = self._num_workers
        sweep_left_behind(self._shm_dir)  # files older versions of chute left (shm_files)
        plan = plan_slabs(
            n,
            self._shm_request,
            self._shm_dir,
            initial=DEFAULT_INITIAL_SHM_BYTES,
            limit=DEFAULT_SHM_LIMIT_BYTES,
        )
        warning = plan.warning
        fds: list[int] = []
        if plan.initial_bytes:
            try:
                for _ in range(n):
                    fds.append(create_slab_fd(self._shm_dir, plan.initial_bytes))
            except OSError as e:
                for fd in fds:
                    os.close(fd)
                fds = []
                mib = plan.initial_bytes / (1 << 20)
                warning = (
                    f"cannot reserve {n} x {mib:.1f} MiB of shared memory in {self._shm_dir} "
                    f"({e}); results go through pipes, which is slower. Give "
                    f"{self._shm_dir} more space (Docker: `--shm-size=2g`) or pass a "
                    "smaller `shm_bytes_per_worker`."
                )
        if warning is not None:
            warnings.warn(warning, SharedMemoryWarning, stacklevel=4)
        self._shm_bytes = plan.initial_bytes if fds else 0
        self._shm_limit = plan.limit_bytes if fds else 0
        return fds

    def _start(self) -> None:
        ctx = forkserver.worker_context(self._start_method)
        fds = self._allocate_slabs()
        in_main_thread = threading.current_thread() is threading.main_thread()
        # The forkserver is a clean process; otherwise the parent is this thread, so
        # PDEATHSIG is only safe when this thread lives as long as the process.
        pdeathsig = self._start_method == "forkserver" or in_main_thread
        if self._start_method == "forkserver":
            # Unpickling a worker's spec imports the module of its function: import it
            # once in the server instead, if this starts it.
            forkserver.ensure_forkserver([type(self._worker_fn).__module__])
        child_conns = []
        child_fds: list[int] = []
        try:
            for i in range(self._num_workers):
                main_conn, child_conn = ctx.Pipe(duplex=True)
                child_conns.append(child_conn)
                # Never blocks the worker's signal handler: a full pipe loses a dump instead.
                stack_read, stack_write = os.pipe()
                os.set_blocking(stack_read, False)
                os.set_blocking(stack_write, False)
                child_fds.append(stack_write)
                slab = map_slab(fds[i], self._shm_bytes) if fds else None
                spec = WorkerSpec(
                    index=i,
                    num_workers=self._num_workers,
                    worker_fn=self._worker_fn_pickle,
                    worker_init_fn=self._worker_init_fn_pickle,
                    conn=child_conn,
                    slab=InheritedFd(fds[i]) if fds else None,
                    stack=InheritedFd(stack_write),
                    handed=tuple((k, InheritedFd(fd)) for k, fd in self._handed_fds.items()),
                    slab_bytes=self._shm_bytes,
                    grow_to=self._shm_limit,
                    shm_dir=self._shm_dir,
                    headroom=min(self._buffer_size + 2, 8),
                    min_shared_bytes=self._min_shared_bytes,
                    pdeathsig=pdeathsig,
                )
                process = ctx.Process(  # type: ignore[attr-defined]
                    target=run_worker, args=(spec,), name=f"{WORKER_NAME_PREFIX}{i}", daemon=True
                )
                receiver = ResultReceiver(main_conn, slab)
                self._state.workers.append(_Worker(process, main_conn, receiver, stack_read))
            # Children are born with SIGINT blocked; they ignore it, then unblock it.
            if in_main_thread:
                old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                for w in self._state.workers:
                    w.process.start()
                if self._start_method == "forkserver":
                    forkserver.mark_served()
            finally:
                if in_main_thread:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)
        finally:
            for c in child_conns:
                c.close()
            for fd in [*fds, *child_fds]:
                os.close(fd)

    def put(self, worker_index: int, task: TaskT) -> None:
        """Sends `task` to worker `worker_index`. Never blocks on the worker.

        Raises `PoolUsageError` if the worker already has `buffer_size` tasks outstanding.
        """
        w = self._worker(worker_index)
        self.start()
        if len(w.pending) >= self._buffer_size:
            raise PoolUsageError(
                f"worker {worker_index} already has {len(w.pending)} tasks outstanding, the "
                f"most buffer_size={self._buffer_size} allows. `get({worker_index})` a result "
                "before putting another task, or make buffer_size larger."
            )
        try:
            data = pickle.dumps(task, protocol=5)
        except Exception as e:
            raise NotPicklableError(
                f"task {task!r} cannot be pickled, so it cannot be sent to worker "
                f"{worker_index} ({type(e).__name__}: {e}). Send plain data (numbers, "
                "strings, arrays, tuples) and do the work in worker_fn."
            ) from e
        seq = w.next_seq
        try:
            w.flush_frees()
            w.conn.send_bytes(b"T" + seq.to_bytes(8, "little") + data)
        except OSError:
            self._raise_died(worker_index)
        except BaseException:
            # Interrupted part-way through a frame (Ctrl-C): the stream is undefined.
            self._close_for(f"sending a task to worker {worker_index} was interrupted")
            raise
        w.next_seq += 1
        w.pending.append((seq, task))

    def get(self, worker_index: int, timeout: float | None = None) -> ResultT:
        """The result of the oldest outstanding task of worker `worker_index`.

        Blocks until it arrives, the worker dies (`WorkerDiedError`) or `timeout` seconds
        pass (`TimeoutError`; the pool stays usable). An exception raised by `worker_fn`
        is re-raised here, and closes the pool.
        """
        w = self._worker(worker_index)
        if not w.pending:
            raise PoolUsageError(
                f"worker {worker_index} has no task outstanding, so `get` would wait "
                f"forever. `put({worker_index}, task)` first."
            )
        for other in self._state.workers:
            # A dead worker is reported when its own result is asked for.
            with contextlib.suppress(OSError):
                other.flush_frees()
        ready = wait([w.conn, w.process.sentinel], timeout)
        if not ready:
            raise TimeoutError(
                f"worker {worker_index} returned no result within {timeout} s; it is still "
                "working on its oldest task. Call `get` again to keep waiting."
            )
        if w.conn not in ready and not w.conn.poll(0):
            self._raise_died(worker_index)
        try:
            message = w.receiver.recv()
        except (EOFError, OSError):
            self._raise_died(worker_index)
        except BaseException:
            # Interrupted part-way through a message (Ctrl-C) or a result that cannot be
            # unpickled here: the pipe is no longer in a known state.
            self._close_for(f"reading a result from worker {worker_index} failed")
            raise
        while w.receiver.warnings:
            warnings.warn(w.receiver.warnings.popleft(), SharedMemoryWarning, stacklevel=2)
        seq, task = w.pending.popleft()
        if isinstance(message, RemoteFailure):
            self._raise_remote(worker_index, message, task)
        got_seq, result = message
        if got_seq != seq:
            self._close_for("results arrived out of order")
            raise WorkerError(
                f"worker {worker_index} returned the result of task #{got_seq} while task "
                f"#{seq} was expected; this is a bug in chute, please report it."
            )
        return result  # type: ignore[return-value]

    def stack(self, worker_index: int, wait: float = 2.0) -> str | None:
        """The Python stack of every thread of worker `worker_index`, as `faulthandler`
        prints it (most recent call first), or None if the worker cannot give one yet
        (still starting: importing `__main__`, unpickling `worker_fn`) or any more.

        Sends the worker SIGUSR1 and waits up to `wait` seconds for the dump; the worker
        goes on with its work. For diagnosing a worker that has produced nothing for long.
        """
        w = self._worker(worker_index)
        w.read_stack_pipe(0.0, 0.0)  # the ready marker, or what an earlier dump left
        if not w.stack_ready or w.process.pid is None or w.process.exitcode is not None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.process.pid, signal.SIGUSR1)
        text = w.read_stack_pipe(wait, 0.3, b"Current thread").decode("utf-8", "replace")
        return text or None

    def close(self) -> None:
        """Stops every worker and releases the pool's resources. Idempotent.

        Arrays already returned stay valid: their shared memory lives until they are
        garbage collected.
        """
        self._finalizer()

    def __enter__(self) -> WorkerPool[TaskT, ResultT]:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "running" if self._started else "not started"
        return (
            f"WorkerPool(num_workers={self._num_workers}, worker_fn={self._worker_fn!r}, "
            f"start_method={self._start_method!r}, {state})"
        )

    def _check_open(self) -> None:
        if self._state.closed:
            raise PoolClosedError(
                f"the worker pool is closed because {self._state.closed_reason}; create a "
                "new WorkerPool to run more tasks."
            )

    def _worker(self, worker_index: int) -> _Worker:
        self._check_open()
        if not 0 <= worker_index < self._num_workers:
            raise IndexError(
                f"worker_index={worker_index!r} is out of range for a pool of "
                f"{self._num_workers} workers (0 to {self._num_workers - 1})."
            )
        self.start()
        return self._state.workers[worker_index]

    def _close_for(self, reason: str) -> None:
        self._state.closed_reason = reason
        self.close()

    def _raise_died(self, worker_index: int) -> NoReturn:
        w = self._state.workers[worker_index]
        w.process.join(1.0)
        pid, exitcode = w.process.pid, w.process.exitcode
        how = _describe_exit(exitcode)
        lost = ""
        if w.pending:
            lost = (
                f" with {len(w.pending)} task(s) outstanding, the oldest being {w.pending[0][1]!r}"
            )
        message = f"worker {worker_index} of {self._num_workers} (pid {pid}) {how}{lost}."
        self._close_for(f"worker {worker_index} died")
        raise WorkerDiedError(message, worker_index=worker_index, exitcode=exitcode)

    def _raise_remote(self, worker_index: int, failure: RemoteFailure, task: object) -> NoReturn:
        exc = failure.rebuild()
        where = (
            "in worker_init_fn (or unpickling worker_fn)"
            if failure.seq < 0
            else f"while running worker_fn on task {task!r}"
        )
        exc.add_note(f"chute: raised in worker {worker_index} of {self._num_workers} {where}")
        self._close_for(f"worker {worker_index} raised {failure.type_name}")
        raise exc from exc.__cause__
