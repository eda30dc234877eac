"""`ChunkService`: the worker processes of one `mp_prefetch` iterator, and the routing of
their tasks and results.

A chunk task goes to the worker likely to be free first (`submit`); a shard goes to the
worker that has read it before (it keeps the shard open). Each task gets a `Ticket`;
results come back in order per worker and are routed to their tickets, received ahead
when already there. Which worker computes a chunk never changes what the chunk holds,
only when it is ready.

One service feeds every reader and shard stream under its `mp_prefetch`, and each may be
advanced on a thread of its own (two `prefetch(n)` branches mixed or zipped, the copies
of `sequential_slice=True`). The pool's channels and the routing (the per-worker queues of
tickets, the tasks in flight) are one state: every method that sends or receives holds
the service's lock, once per chunk, so each worker's results are read by one thread at a
time, in order, and routed to their own tickets. A thread waiting for a result holds the
lock while it waits: that result's task is already sent and its worker needs nothing
more from this process, so the wait ends (or the watchdog ends it).
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from chute._src.core import contract, machine, observe, shm_files
from chute._src.core.dataset import IterDataset, MapDataset, rewrite, walk
from chute._src.core.options import MultiprocessingOptions
from chute._src.exec import autotune
from chute._src.exec.autotune import AUTOTUNE
from chute._src.exec.mp.errors import WorkerDiedError
from chute._src.exec.mp.forkserver import forkserver_cold, forkserver_starting_s, prewarm
from chute._src.exec.mp.pool import WorkerPool
from chute._src.exec.workers import pipeline_pickle, worker
from chute._src.exec.workers.shards import ShardStream
from chute._src.exec.workers.startup import StartupHelper
from chute._src.exec.workers.tasks import ChunkResult, ChunkTask, ShardResult, ShardTask, Task
from chute._src.exec.workers.watchdog import Watchdog
from chute._src.exec.workers.worker import ChunkWorker, ShippedInit

# A worker's chunk should take about this long to compute. Results are consumed in order and
# each worker has `per_worker_buffer_size` chunks asked of it: with 20 ms chunks a worker
# whose chunks ran a little faster than its neighbour's often sat idle with its results
# waiting, and seed 003's text with 2 workers ran 6-9% slower than with 50 ms ones (chunks
# of 100 ms gained nothing more; benchmarks/bench_worker_row.py). The start-up helper keeps
# short chunks: it computes only what the first batch needs.
TARGET_CHUNK_S = 0.05
HELPER_CHUNK_S = 0.02
_WORKER_BYTES = 256 << 20  # the memory a worker is assumed to take, for AUTOTUNE
_DIED_AT_START = (
    "chute: the worker died before returning any result: it was killed (out of memory, a "
    "signal) or crashed in native code while starting or computing its first chunk. Its exit "
    "code is above; a worker_init_fn or a module the pipeline imports may be what failed."
)


def autotuned_workers() -> int:
    """`num_workers=AUTOTUNE`: the cores this process may use, fewer if the memory budget
    (a quarter of the available memory) would not hold 256 MiB per worker."""
    return max(1, min(machine.usable_cores(), machine.memory_budget() // _WORKER_BYTES))


class Ticket:
    """A task sent to a worker, and its result once received."""

    __slots__ = ("cold", "discarded", "error", "result", "task", "worker")

    def __init__(self, worker: int, task: Task) -> None:
        self.worker = worker
        self.task = task
        self.result: Any = None
        self.error: BaseException | None = None  # raised when its result is asked for
        self.discarded = False
        self.cold = False  # its worker's first result (imports, lazy loads, fresh memory)


def start_processes(
    options: MultiprocessingOptions,
    leaves: list[MapDataset[Any]],
    streams: list[ShardStream],
    worker_init_fn: Callable[[int, int], None] | None,
    pipeline: IterDataset[Any],
) -> ChunkService:
    """`MultiprocessingOptions.start_service`: worker processes on this machine. Building
    the dataset started nothing: the process that forks the workers starts here, at the
    first iter(), and imports the modules `pipeline`'s tasks name."""
    prewarm(functools.partial(worker_modules, pipeline, worker_init_fn is None))
    return ChunkService(leaves, streams, options, worker_init_fn)


def worker_modules(pipeline: IterDataset[Any], users_too: bool) -> list[str]:
    """The modules a worker imports to unpickle its tasks: the worker's (`ChunkWorker`) and
    those `pipeline`'s pickle refers to, which the forkserver then imports once for every
    worker. The user's modules only with no `worker_init_fn`: with one, they are imported
    after it ran, in each worker, as before."""
    names = [worker.__name__, *pipeline_pickle.referenced_modules(pipeline)]
    return [n for n in names if users_too or n.startswith("chute.")]


class ChunkService:
    """Starts the workers (from a thread: `iter()` does not wait for them), sends tasks,
    routes results back to their tickets, and stops the workers at `close`."""

    target_chunk_s = TARGET_CHUNK_S

    def __init__(
        self,
        leaves: list[MapDataset[Any]],
        streams: list[ShardStream],
        options: MultiprocessingOptions,
        worker_init_fn: Callable[[int, int], None] | None,
    ) -> None:
        self._shared: list[Any] = []
        # Each node as workers receive it (`for_workers`: large in-memory lists shared
        # through shared memory rather than pickled into every worker).
        leaves = [rewrite(leaf, lambda n: contract.for_workers(n, self._shared)) for leaf in leaves]
        stages: list[Any] = [n for leaf in leaves for n in walk(leaf)]
        stages += [shard for stream in streams for shard in stream.shards]
        observer = observe.observing()
        observed = [*leaves, *(n for stream in streams for n in stream.observed())]
        self._merge_figures = observer.figures_merger(observed) if observer is not None else None
        # The shared files the pipeline holds go to the workers as descriptors (shm_files).
        with shm_files.handing_over() as handed:
            payload = pipeline_pickle.dumps((leaves, streams), stages)
            init = ShippedInit.of(worker_init_fn)
        self._handed = handed  # keeps them open until the workers have started
        self._shard_worker: dict[tuple[int, int], int] = {}  # (stream, shard) -> its worker
        shard_requests = min(4096, 2 * sum(len(stream.shards) for stream in streams))
        self.tuning: autotune.Tuning | None = None
        if options.num_workers is AUTOTUNE:
            self.workers = autotuned_workers()
            self.tuning = autotune.Tuning()
            self.tuning.note(
                "num_workers",
                self.workers,
                f"{machine.usable_cores()} usable cores, memory for "
                f"{machine.memory_budget() // _WORKER_BYTES} workers of 256 MiB",
            )
        else:
            self.workers = options.num_workers
        self._several_leaves = len(leaves) > 1
        per_worker = options.per_worker_buffer_size + 1
        self.max_outstanding = max(2, self.workers * options.per_worker_buffer_size)
        self._pool: WorkerPool[Task, Any] = WorkerPool(
            self.workers,
            ChunkWorker(payload),
            worker_init_fn=init,
            buffer_size=per_worker * max(1, len(leaves)) + self.max_outstanding + shard_requests,
            handed_fds=handed.fds,
        )
        self._watchdog = Watchdog(
            self._pool, options.stall_warning_s, options.timeout_s, self.close
        )
        # Held by every method that sends or receives (see the module's docstring).
        self._lock = threading.RLock()
        self._queues: list[deque[Ticket]] = [deque() for _ in range(self.workers)]
        self._shards_held = [0] * self.workers  # shards each worker was given
        self._received = [False] * self.workers
        self.warm = False  # a reader has had an element computed by itself, or a result
        self._next_worker = 0
        self._early_error: BaseException | None = None  # met by `_collect_ready`
        self._seconds_per_element = [0.0] * self.workers  # each worker's recent pace
        # Workers start now, not at the first `next` (they import and unpickle the pipeline
        # while the caller restores a state or its model, as PyTorch's start at `iter`),
        # and from a thread: starting them waits for the forkserver to finish its imports,
        # and `iter()` need not.
        self._start_error: BaseException | None = None
        # Only while the first pool waits for the forkserver's imports, and only when no
        # worker_init_fn sets up what elements may need in a worker (`startup.py`).
        self.helper: StartupHelper | None = None
        if worker_init_fn is None and self._pool.start_method == "forkserver" and forkserver_cold():
            self.helper = StartupHelper(lambda: self.started, forkserver_starting_s, HELPER_CHUNK_S)
        self._starter: threading.Thread | None = threading.Thread(
            target=self._start_workers, name="chute-start-workers", daemon=True
        )
        self._starter.start()

    def _start_workers(self) -> None:
        try:
            self._pool.start()
        except BaseException as e:
            self._start_error = e

    def start(self) -> None:
        """Waits for the workers to be started (not ready); raises what starting raised.
        Takes no lock: `close` calls it while another thread may hold the lock."""
        starter = self._starter
        if starter is None:
            return
        starter.join()
        self._starter = None
        error = self._start_error
        if error is not None:
            self._start_error = None  # (two threads here at once both raise it)
            raise error

    @property
    def started(self) -> bool:
        """Whether the workers are started (so `submit` does not wait for them)."""
        return self._starter is None or not self._starter.is_alive()

    def startup_helper(self) -> StartupHelper | None:
        """The helper thread computing elements while the program's first workers start;
        None once they are started (or when there is none)."""
        helper = self.helper
        if helper is not None and (helper.stuck or self.started):
            helper.close()  # (idempotent: readers on two threads may both get here)
            self.helper = helper = None
        return helper

    def submit(self, leaf: int, start: int, k: int) -> Ticket:
        """Asks for chunk `[start, start + k)` of leaf `leaf` from the worker likely to be
        done first with what it has been asked: its elements not yet computed times its
        recent seconds per element (round-robin among equals).

        Results are consumed in index order. Given out in turn, each worker would compute
        every other chunk, so all would go at the pace of the slowest (one sharing its core
        with the consumer): the others then sat idle with their results waiting, for a
        tenth of the time on seed 003's packed text with 2 workers."""
        self.start()
        with self._lock:
            self._collect_ready()
            n, first, owed = self.workers, self._next_worker, self._owed_seconds
            w = min(range(first, first + n), key=lambda i: owed(i % n)) % n
            self._next_worker = (w + 1) % n
            return self._send(w, ChunkTask(leaf, start, k))

    def _owed_seconds(self, worker: int) -> float:
        """About how long `worker` will take to compute the chunks it has not returned."""
        elements = sum(t.task.k for t in self._queues[worker] if isinstance(t.task, ChunkTask))
        known = [s for s in self._seconds_per_element if s > 0]
        pace = self._seconds_per_element[worker] or (sum(known) / len(known) if known else 1.0)
        return elements * pace

    def _collect_ready(self) -> None:
        """Receives the results already waiting (without waiting): what remains in a
        worker's queue is then what it has still to compute. A failure met here is kept on
        its ticket, and raised when that result is asked for, as it would have been."""
        if self._early_error is not None:
            return
        pool = self._pool
        for w, queue in enumerate(self._queues):
            while queue and pool.ready(w):
                oldest = queue[0]
                try:
                    self._receive(oldest)
                except BaseException as e:
                    oldest.error = self._early_error = e
                    queue.popleft()
                    return

    def submit_stream(self, task: ShardTask) -> Ticket:
        """Asks for steps of a shard from the worker that has read it before (which then
        replaces the copy it has open when the request brings a state to start from), or
        first from the worker with the fewest shards (then the fewest requests waiting).
        Shards are opened one after the other, each once the one before has given its
        first element, so queues are often equally empty: by queue length alone, the first
        worker would take nearly every shard while the others idle."""
        self.start()
        with self._lock:
            key = (task.stream, task.shard)
            w = self._shard_worker.get(key)
            if w is None:
                held = self._shards_held
                w = min(range(self.workers), key=lambda i: (held[i], len(self._queues[i])))
                self._shard_worker[key] = w
                held[w] += 1
            return self._send(w, task)

    def _send(self, worker: int, task: Task) -> Ticket:
        ticket = Ticket(worker, task)
        if self._early_error is not None:  # the pool is closed: the error comes first
            ticket.error = self._early_error
            return ticket
        self._pool.put(worker, task)
        self._queues[worker].append(ticket)
        return ticket

    def stream_result(self, ticket: Ticket) -> tuple[ShardResult, BaseException | None]:
        """The result of a `submit_stream` request, with its exception re-created here."""
        with self._lock:
            result: ShardResult = self._wait(ticket)
            if result.figures and self._merge_figures is not None:  # debug mode's, from the worker
                self._merge_figures(result.figures)
        return result, self._rebuilt(result.failure, ticket)

    def result(self, ticket: Ticket) -> tuple[ChunkResult, BaseException | None]:
        """A chunk's result: its elements, or those before the one that raised and that
        one's exception (re-created here)."""
        with self._lock:
            result: ChunkResult = self._wait(ticket)
            if result.figures and self._merge_figures is not None:  # debug mode's figures
                self._merge_figures(result.figures)
        return result, self._rebuilt(result.failure, ticket)

    def _rebuilt(self, failure: Any, ticket: Ticket) -> BaseException | None:
        if failure is None:
            return None
        exc: BaseException = failure.rebuild()
        exc.add_note(f"chute: raised in worker {ticket.worker} of {self.workers}")
        return exc

    def _wait(self, ticket: Ticket) -> Any:
        """The result of `ticket`, receiving those before it from its worker (the lock
        held)."""
        self.start()
        queue = self._queues[ticket.worker]
        while ticket.result is None and ticket.error is None:
            self._receive(queue[0])
        if ticket.error is not None:
            raise ticket.error
        out, ticket.result = ticket.result, None
        return out

    def _receive(self, oldest: Ticket) -> None:
        """Receives the result of `oldest`, its worker's oldest task not received yet."""
        worker = oldest.worker
        try:
            result = self._get(oldest)
        except WorkerDiedError as e:
            if not self._received[worker]:
                e.add_note(_DIED_AT_START)
            raise
        self._queues[worker].popleft()
        oldest.result = result
        oldest.cold = not self._received[worker]
        task = oldest.task
        # Its pace, for `submit`; not from its first result, which pays its one-off costs
        # (imports, a tokenizer loaded on first use): sized by it, the others would get
        # every chunk while it sat idle.
        if isinstance(task, ChunkTask) and result.seconds > 0 and not oldest.cold:
            pace = result.seconds / task.k
            was = self._seconds_per_element[worker]
            self._seconds_per_element[worker] = pace if not was else (was + pace) / 2
        self._received[worker] = True
        self.warm = True

    def _get(self, ticket: Ticket) -> Any:
        return self._watchdog.get(ticket.worker, lambda: self._describe(ticket))

    def _describe(self, ticket: Ticket) -> str:
        pids = self._pool.pids
        pid = f" (pid {pids[ticket.worker]})" if ticket.worker < len(pids) else ""
        where = ticket.task.describe(self._several_leaves)
        return f"worker {ticket.worker} of {self.workers}{pid}, computing {where},"

    def discard(self, ticket: Ticket) -> None:
        """Drops a ticket whose result is no longer wanted (after `set_state`)."""
        self.start()
        with self._lock:
            ticket.discarded = True
            queue = self._queues[ticket.worker]
            while ticket in queue:
                oldest = queue.popleft()
                result = self._get(oldest)
                if not oldest.discarded:  # another reader's, still wanted: kept for it
                    oldest.result = result
                if oldest is ticket:
                    break

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()
            self.helper = None
        try:
            self.start()
        except BaseException:
            pass  # the pool is closed all the same; the error was or will be raised
        self._pool.close()
        for shared in self._shared:
            shared.unlink()
