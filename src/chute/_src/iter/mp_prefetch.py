"""`IterDataset.mp_prefetch`: worker processes, with output independent of their number.

Workers compute fixed, index-addressed chunks of the random-access part of the pipeline:
every `to_iter_dataset` leaf (its `MapDataset`, plus any `map`/`filter` IterDataset stages
directly above it, which are moved into the workers because they act element by element).
The main process asks for chunks in index order, reassembles them, and runs the rest of
the pipeline (batching after a filter, packing, mixing: the order-dependent stages) on the
reassembled stream. So the elements, and the iterator states, are exactly those of the
same pipeline run with no workers; a state taken with any number of workers restores
into any other number. The state holds no worker buffers and taking it needs no IPC.

Errors too: a chunk whose element raises comes back as the elements before it plus the
exception, raised when the consumer reaches that element, as without workers. While the
consumer waits for a worker, `MultiprocessingOptions.stall_warning_s` and `timeout_s`
bound the wait (a warning with the worker's stack, then an error).
"""

from __future__ import annotations

import functools
import pickle
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from chute._src import autotune, config, observe, pipeline_pickle
from chute._src.autotune import AUTOTUNE
from chute._src.dataset import IterDataset, MapDataset, rewrite_graph, stages_sources_first
from chute._src.executors import ChunkExecutor, Parallelism, getitems_exact, nbytes
from chute._src.iter.mp_shards import (
    DropHoles,
    ShardReader,
    ShardStream,
    WorkerShard,
    has_reader,
)
from chute._src.iter.mp_startup import StartupHelper, compute_beside
from chute._src.iterator import DatasetIterator
from chute._src.mp import heap
from chute._src.mp.errors import WorkerDiedError, WorkerStallWarning, WorkerTimeoutError
from chute._src.mp.pool import WorkerPool, forkserver_cold, forkserver_starting_s, prewarm
from chute._src.mp.transport import RemoteFailure
from chute._src.options import MultiprocessingOptions
from chute._src.protocol import StageRole

T = TypeVar("T")

_DIED_AT_START = (
    "chute: the worker died before returning any result. If it printed 'An attempt has been "
    "made to start a new process before the current process has finished its bootstrapping "
    "phase', your script starts the pipeline at import time: worker processes re-import the "
    "main script, so put the code that iterates under `if __name__ == '__main__':`."
)
_TARGET_CHUNK_S = 0.02  # a worker's chunk should take about this long to compute
_MAX_CHUNK = 4096
_CHUNK_BYTES = 4 << 20
_STREAM = -1  # the first item of a task for a shard of a stream (`mp_shards`)


class MultiprocessPrefetchIterDataset(IterDataset[T]):
    """Runs `parent`'s random-access part in `options.num_workers` worker processes."""

    def __init__(
        self,
        parent: IterDataset[T],
        options: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], None] | None = None,
        sequential_slice: bool = False,
    ) -> None:
        super().__init__([parent])
        if not isinstance(sequential_slice, bool):
            raise TypeError(
                f"mp_prefetch: sequential_slice={sequential_slice!r} is not a bool: pass True "
                "or False."
            )
        if options is not None and not isinstance(options, MultiprocessingOptions):
            raise TypeError(
                f"mp_prefetch: options={options!r} is not a MultiprocessingOptions: pass "
                "chute.MultiprocessingOptions(num_workers=N)."
            )
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(
                f"mp_prefetch: worker_init_fn={worker_init_fn!r} is not callable: pass a "
                "function f(worker_index, worker_count), or None."
            )
        self._options = options or MultiprocessingOptions(num_workers=AUTOTUNE)
        self._worker_init_fn = worker_init_fn
        if self._options.num_workers != 0:
            # Start the process that forks the workers now, while the pipeline is being
            # built: its imports then overlap the user's work instead of the first batch.
            prewarm(functools.partial(_worker_modules, parent, worker_init_fn is None))
        # Grain's workers read strided slices of the source, or contiguous ones with
        # sequential_slice=True (a different order). chute's workers always compute
        # contiguous chunks of indices, reassembled in index order: the output is the same
        # either way, so the flag is accepted and changes nothing.
        self._sequential_slice = sequential_slice

    @property
    def options(self) -> MultiprocessingOptions:
        return self._options

    @property
    def role(self) -> StageRole:  # type: ignore[override]
        # With no workers, it hands its input on and does nothing else.
        return StageRole.PASS_THROUGH if self._options.num_workers == 0 else StageRole.PREFETCH

    @property
    def concurrent(self) -> bool:
        return self._options.num_workers != 0

    def make_iterator(self) -> DatasetIterator[T]:
        if self._options.enable_profiling and not config.get("py_debug_mode"):
            with config.debug_mode_here():  # the stages below record and print statistics
                return self._make_unprofiled_iterator()
        return self._make_unprofiled_iterator()

    def _make_unprofiled_iterator(self) -> DatasetIterator[T]:
        parent: IterDataset[T] = self._parents[0]  # type: ignore[assignment]
        if self._options.num_workers == 0:
            return _MultiprocessIterator(parent._iter(), None)
        leaves: list[MapDataset[Any]] = []
        streams: list[ShardStream] = []
        box = _ServiceBox()
        main_chain = _substitute(parent, leaves, streams, box)
        if not leaves and not streams:
            warnings.warn(
                f"mp_prefetch: {parent!r} is one stream that cannot be split: it has no "
                "random-access part (a MapDataset turned into an IterDataset with "
                "to_iter_dataset) and no stream of shards (InterleaveIterDataset, "
                "JsonlIterDataset, FileLinesIterDataset) for workers to read, so it runs in "
                "this process. To use workers, give one IterDataset per shard (file) to "
                "experimental.InterleaveIterDataset (IterDataset.source(lambda: "
                "read(shard)) for each), or build the expensive steps on a MapDataset.",
                stacklevel=2,
            )
            return _MultiprocessIterator(parent._iter(), None)
        box.service = service = _ChunkService(leaves, streams, self._options, self._worker_init_fn)
        return _MultiprocessIterator(main_chain._iter(), service)

    def __repr__(self) -> str:
        return f"MultiprocessPrefetchIterDataset(num_workers={self._options.num_workers})"


def _worker_modules(parent: IterDataset[Any], users_too: bool) -> list[str]:
    """The modules a worker imports to unpickle its tasks: this one (`_ChunkWorker`) and
    those `parent`'s pickle refers to, which the forkserver then imports once for every
    worker. The user's modules only with no `worker_init_fn`: with one, they are imported
    after it ran, in each worker, as before."""
    names = [__name__, *pipeline_pickle.referenced_modules(parent)]
    return [n for n in names if users_too or n.startswith("chute.")]


_WORKER_BYTES = 256 << 20  # the memory a worker is assumed to take, for AUTOTUNE


def autotuned_workers() -> int:
    """`num_workers=AUTOTUNE`: the cores this process may use, fewer if the memory budget
    (a quarter of the available memory) would not hold 256 MiB per worker."""
    return max(1, min(autotune.usable_cores(), autotune.memory_budget() // _WORKER_BYTES))


class _MultiprocessIterator(DatasetIterator[T]):
    """The stage the user holds; its state is its parent's (so the same with any number
    of workers, or without the stage)."""

    stage = "mp_prefetch"
    transparent = True

    def __init__(self, parent: DatasetIterator[T], service: _ChunkService | None) -> None:
        super().__init__(parent)
        self._service = service
        if service is not None:
            weakref.finalize(self, service.close)

    def __next__(self) -> T:
        try:
            return next(self._parent)
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise

    def _next_many(self, n: int) -> list[T]:
        try:
            return self._parent._next_many(n)
        except BaseException:
            self.close()
            raise

    def start_prefetch(self) -> None:
        if self._service is not None:
            self._service.start()
        self._parent.start_prefetch()

    def close(self) -> None:
        self._parent.close()
        if self._service is not None:
            self._service.close()

    def tuning(self) -> autotune.Tuning | None:
        return self._service.tuning if self._service is not None else None

    def parallelism(self) -> Parallelism:
        """The worker processes computing the elements (0: none, a pass-through)."""
        return Parallelism(processes=self._service.active if self._service is not None else 0)


# -- rewriting the pipeline: leaves fed by workers, element-wise stages moved into them ------


class _ServiceBox:
    """Where the rewritten readers find the chunk service, made once all leaves are known."""

    service: _ChunkService | None = None


def _substitute(
    ds: IterDataset[Any],
    leaves: list[MapDataset[Any]],
    streams: list[ShardStream],
    box: _ServiceBox,
) -> IterDataset[Any]:
    """A copy of `ds` whose readers (`to_iter_dataset`) get their chunks from workers, and
    whose streams of shards have their shards read by workers, with the element-wise
    stages directly above them moved into the workers (see module doc)."""
    hoisted: list[IterDataset[Any]] = []
    node: IterDataset[Any] = ds
    while node.role is StageRole.ELEMENT_WISE:
        hoisted.append(node)
        node = node.parents[0]  # type: ignore[assignment]
    shards: list[IterDataset[Any]] = list(node.parents)  # type: ignore[arg-type]
    if node.reads_shards and not any(has_reader(p) for p in shards):
        # A stream of shards (`_src/iter/mp_shards.py`): each shard read whole in a worker.
        streams.append(ShardStream(shards, hoisted))
        s = len(streams) - 1
        merged = node.with_parents([WorkerShard(p, s, j, box) for j, p in enumerate(shards)])
        if hoisted:
            merged = DropHoles(merged)
        for stage in reversed(hoisted):
            merged = _DoneInWorkers(merged, stage.stage_name, stage.position_params)
        return merged
    if node.role is StageRole.READER:
        kept: list[IterDataset[Any]] = []
        # A reader (`_src/protocol.py`, READER) that hands filtered elements on as None:
        if node.allow_nones:  # type: ignore[attr-defined]
            # The stages above see the Nones: they stay in the main process, as they are.
            hoisted, kept = [], hoisted
        mapped: MapDataset[Any] = node.parents[0]  # type: ignore[assignment]
        for stage in reversed(hoisted):
            mapped = stage.as_map_stage(mapped)
        observer = observe.observing()
        if observer is not None:
            mapped = observer.map_chain(mapped)
        leaves.append(mapped)
        leaf_id = len(leaves) - 1

        def executor(leaf: MapDataset[Any] = mapped, leaf_id: int = leaf_id) -> ChunkExecutor:
            assert box.service is not None, "a worker-fed reader iterated before the service"
            return WorkerChunks(leaf, leaf_id, box.service)

        out: IterDataset[Any] = node.with_executor(executor)  # type: ignore[attr-defined]
        for stage in reversed(hoisted):
            out = _DoneInWorkers(out, stage.stage_name, stage.position_params)
        for stage in reversed(kept):
            out = stage.with_parents([out])
        return out
    return ds.with_parents(
        [
            _substitute(p, leaves, streams, box) if isinstance(p, IterDataset) else p
            for p in ds.parents
        ]
    )


class _DoneInWorkers(IterDataset[Any]):
    """Stands where a `map`/`filter` was that now runs in the workers: a pass-through with
    the same stage name, so the state has the same shape as without workers."""

    role = StageRole.PASS_THROUGH
    internal = True

    def __init__(self, parent: IterDataset[Any], stage: str, params: str) -> None:
        super().__init__([parent])
        self._stage = stage
        self._params = params

    def make_iterator(self) -> DatasetIterator[Any]:
        return _PassThrough(self._parent_iter(), self._stage)

    def __repr__(self) -> str:
        return f"{self._stage} (done in the workers)"

    def _fingerprint_params(self) -> str:
        return self._params  # the moved stage's, recorded in the state as without workers


class _PassThrough(DatasetIterator[Any]):
    def __init__(self, parent: DatasetIterator[Any], stage: str) -> None:
        super().__init__(parent)
        self.stage = stage  # type: ignore[misc]

    def __next__(self) -> Any:
        return next(self._parent)

    def _next_many(self, n: int) -> list[Any]:
        return self._parent._next_many(n)


class WorkerChunks(ChunkExecutor):
    """A reader's chunks computed by the worker processes of `service`.

    Chunks `[start, start + k)` are asked for in index order, `k` adapting to ~20 ms of
    work; the reader keeps the in-process state (the next index and the fingerprint of
    the original MapDataset), so states move freely between worker counts.

    While no worker has delivered a result yet (they are starting: forking, importing,
    unpickling the pipeline), the first element asked for is computed in the consumer's
    process (on a thread beside the consumer's while the workers start, so that they are
    given the ones after it as soon as they are started), and the workers compute the
    ones after it: the first batch does not wait for the workers' start. Element `i` is
    the same wherever it is computed.

    The first pool of a program also waits for the forkserver's imports (~0.2 s, more with
    the main script's). Until its workers are started, a helper thread of this process
    (`mp_startup.StartupHelper`) goes on computing the elements asked for, in runs sized
    as the workers' chunks are, keeping each run that succeeds and pickles; a run in which
    an element raises or cannot be pickled, or that outlasts the start, is left to the
    workers, which report it as always, and so is the last element, so that workers that
    cannot start (a script without its `__main__` guard) are reported even when the rest
    was computed here. The workers' first chunks are sized from the helper's runs.
    So a batch of cheap elements assembled after this stage (rows of text) does not wait
    for the workers' start either.
    """

    concurrent = True
    bound_to_thread = True  # the service's channels belong to the consumer's thread

    def parallelism(self) -> Parallelism:
        return Parallelism(processes=self._service.active)

    def __init__(self, leaf: MapDataset[Any], leaf_id: int, service: _ChunkService) -> None:
        super().__init__(leaf)  # what the workers compute: the MapDataset plus moved stages
        self._leaf_id = leaf_id
        self._service = service
        self._pending: deque[tuple[int, int, _Ticket]] = deque()
        self._submitted = 0
        self._chunk = 1  # grows (doubling) from the first result: a fast first element
        self._local: int | None = None  # an index left to the consumer while workers start
        # (index, exception): a chunk failed at this index; raised when the consumer
        # has had every element before it.
        self._failure: tuple[int, BaseException] | None = None
        self._closed = False

    def _top_up(self) -> None:
        limit = self._service.max_outstanding
        while len(self._pending) < limit and self._submitted < self.length:
            start = self._submitted
            k = min(self._chunk, self.length - start)
            self._pending.append((start, k, self._service.submit(self._leaf_id, start, k)))
            self._submitted = start + k

    def next_chunk(self, start: int) -> list[Any]:
        if self._failure is not None and self._failure[0] == start:
            exc = self._failure[1]
            self._failure = None
            raise exc
        if self._local == start or (
            self._local is None and not self._pending and self._leave_to_consumer(start)
        ):
            self._local = None
            ds = self.ds
            if self._service.started:
                self._top_up()  # the workers get the elements after it meanwhile
                items = _compute_for_workers(ds, start)
            else:
                # Workers starting meanwhile (~0.02 s once the forkserver runs) are given
                # the elements after it then, not when it is done (~0.1 s for a batch of
                # images, all of it idle for them).
                begun = time.perf_counter()
                items = compute_beside(
                    lambda: _compute_for_workers(ds, start),
                    lambda: self._service.started,
                    self._top_up,
                )
                self._service.computed_here_s(time.perf_counter() - begun)
            if self._service.started:
                self._top_up()  # else at the next chunk, which waits for the workers
            return items
        if (
            self._local is None
            and not self._pending
            and self._submitted == start
            and start + 1 < self.length  # the last is the workers': they report a failure
            and not self._closed
            and self._service.computes_here()
        ):
            here = self._compute_here(start)
            if here is not None:
                return here
        if not self._pending or self._pending[0][0] != start:
            self.seek(start)
        self._top_up()
        ticket = self._pending.popleft()[2]
        self._top_up()
        return self._result(start, ticket)

    def _result(self, start: int, ticket: _Ticket) -> list[Any]:
        elapsed, items, failure = self._service.result(ticket)
        if failure is not None:  # items holds the elements before the failing one
            self._failure = (start + len(items), failure)
        if not ticket.cold:
            # A worker's first chunk pays its one-off costs (a tokenizer loaded on first
            # use, a file's index, fresh memory: 5 times a row's time for text); sized from
            # it, the next chunks would shrink to a few elements and grow back over several
            # results, each a round trip.
            self._resize(items, elapsed, failure is not None)
        self._service.observe(len(items))
        return items

    def _resize(self, items: list[Any], elapsed: float, failed: bool) -> None:
        """Sizes the chunks asked for next from `items`, computed in `elapsed` seconds
        (and the one after them, which raised, if `failed`)."""
        # Chunks aim at ~20 ms of work, but never at more than _CHUNK_BYTES of arrays:
        # large results must fit the workers' shared-memory slabs, or they fall back to
        # pipes. Either way only scheduling changes, never which elements come out.
        per_element = nbytes(items) / max(1, len(items))
        cap = (
            _MAX_CHUNK
            if not per_element
            else max(1, min(_MAX_CHUNK, int(_CHUNK_BYTES // per_element)))
        )
        # Sized from this chunk's own time per element (chunks in flight were sized
        # earlier: doubling the current size on each fast result would overshoot and then
        # swing back), growing at most 4-fold per result from the size measured.
        measured = len(items) + failed
        if measured and elapsed > 0:
            ideal = int(_TARGET_CHUNK_S * measured / elapsed)
            self._chunk = max(1, min(ideal, 4 * measured, cap))

    def _compute_here(self, start: int) -> list[Any] | None:
        """Elements from `start` on, computed in this process while the workers start;
        None if one raises or cannot be pickled, or if they outlast the start: the
        workers then compute them and report that as they report any failure or stall
        (naming worker and index)."""
        ds = self.ds
        # As many as the helper can likely compute before the workers start, never the
        # last element (see the class's docstring).
        k = self._service.count_here(self.length - 1 - start)
        if k == 0:
            return None

        def elements() -> list[Any] | None:
            # One that raises fails the whole run (the helper answers None): the workers
            # compute it again element by element and report the failure.
            items: list[Any] = ds._getitems(np.arange(start, start + k, dtype=np.int64))
            return None if _first_unpicklable(items) is not None else items

        # The workers, once started, get the elements after these meanwhile, in chunks
        # sized from the time these took.
        self._submitted = start + k
        begun = time.perf_counter()
        result: list[Any] | None = self._service.compute_here(elements, k, self._top_up)
        if result is not None:
            self._resize(result, time.perf_counter() - begun, False)
        else:
            # The workers compute the run again one element at a time, as a failed chunk
            # is: the elements before one that fails or hangs come out before it.
            self._chunk = 1
        return result

    def _leave_to_consumer(self, start: int) -> bool:
        """Whether element `start` (nothing asked of the workers from it on) is computed
        by the consumer: while the workers are starting, once per iterator."""
        if self._closed or self._service.warm or self._submitted != start:
            return False
        self._service.warm = True  # only the first element: then the workers' pace
        self._submitted = start + 1
        heap.raise_threshold()  # its arrays then reuse freed memory (see `heap`)
        return True

    def seek(self, start: int) -> None:
        self._failure = None
        self._local = None
        if not self._closed:
            for _, _, ticket in self._pending:
                self._service.discard(ticket)
        self._pending.clear()
        self._submitted = start

    def start(self) -> None:
        if not self._closed:
            if not self._pending and self._leave_to_consumer(self._submitted):
                self._local = self._submitted - 1
            if self._local is None or self._service.started:
                self._top_up()

    def in_flight(self) -> int:
        return sum(k for _, k, _ in self._pending)

    def release(self) -> None:
        pass  # the workers belong to the mp_prefetch stage, which stops them

    def close(self) -> None:
        self._closed = True
        self._pending.clear()


# -- the worker side ---------------------------------------------------------------------


class _ChunkWorker:
    """The function each worker runs: compute chunk `(leaf, start, k)` of the leaves.

    Returns `(seconds, elements, statistics, failure)`. When an element raises, the
    chunk is recomputed one element at a time (as `to_iter_dataset` does in-process), and
    `elements` holds those before the failing one, `failure` its exception: the consumer
    receives every element before the failing one, whatever the number of workers.
    """

    def __init__(self, payload: bytes) -> None:
        self._payload = payload
        self._leaves: list[MapDataset[Any]] | None = None
        self._shards: ShardReader | None = None
        self._take_figures: Callable[[], list[Any]] | None = None

    def prepare(self) -> None:
        """Called by the worker as it starts, before any task: unpickles the pipeline
        (importing its modules) while the main process has not asked for anything yet.
        A failure is left to the first task, which raises it at its element."""
        try:
            self._load()
        except BaseException:
            pass

    def _load(self) -> list[MapDataset[Any]]:
        if self._leaves is None:
            self._leaves, streams = pipeline_pickle.loads(self._payload)
            self._shards = ShardReader(streams)
            self._payload = b""  # the unpickled pipeline is all a worker needs from now on
            # Unpickling a pipeline built in debug mode installed the debug layer's observer.
            observer = observe.current()
            if observer is not None:
                self._take_figures = observer.worker_start(self._leaves)
        return self._leaves

    def __call__(self, worker_index: int, num_workers: int, task: tuple[Any, ...]) -> Any:
        leaves = self._load()
        if task[0] == _STREAM:
            assert self._shards is not None
            return self._shards(worker_index, num_workers, task)
        leaf, start, k = task
        t0 = time.perf_counter()
        ds = leaves[leaf]
        failure: RemoteFailure | None = None
        try:
            items = ds._getitems(np.arange(start, start + k, dtype=np.int64))
        except (Exception, SystemExit) as e:
            items, exc = _elements_before_failure(ds, start, k, e)
            if isinstance(exc, SystemExit):
                exc = _exit_as_error(exc, start + len(items))
            failure = RemoteFailure.capture(exc) if exc is not None else None
        figures = self._take_figures() if self._take_figures is not None else []
        return time.perf_counter() - t0, items, figures, failure

    def not_picklable(self, task: tuple[Any, ...], result: Any, exc: BaseException) -> Any:
        """Called by the worker when `result` cannot be pickled: the elements before the
        first that cannot, and an error naming that element's index."""
        fix = (
            "cannot be sent from the worker process; make the stages return picklable "
            "values (no lambdas, generators, open files or locks)"
        )
        if task[0] == _STREAM:  # a shard's steps: stop before the step that cannot go
            elapsed, steps, _, _ = result
            found = _first_unpicklable([items for items, _ in steps])
            if found is None:
                raise exc
            n, e = found
            e.add_note(f"chute: an element of shard {task[2]} cannot be pickled, so it {fix}")
            return elapsed, steps[:n], True, RemoteFailure.capture(e)
        elapsed, items, deltas, _ = result
        _, start, _ = task
        found = _first_unpicklable(items)
        if found is None:
            raise exc
        position, e = found
        e.add_note(f"chute: the element at index {start + position} cannot be pickled, so it {fix}")
        return elapsed, items[:position], deltas, RemoteFailure.capture(e)

    def __repr__(self) -> str:
        return "chute worker"


class _ShippedInit:
    """`worker_init_fn` pickled as the pipeline is (by value, so closures and lambdas
    work), called in each worker."""

    def __init__(self, payload: bytes) -> None:
        self._payload = payload

    @staticmethod
    def of(fn: Callable[[int, int], None] | None) -> _ShippedInit | None:
        if fn is None:
            return None
        return _ShippedInit(pipeline_pickle.dumps(fn, [fn], "mp_prefetch: worker_init_fn"))

    def __call__(self, worker_index: int, num_workers: int) -> None:
        pipeline_pickle.loads(self._payload)(worker_index, num_workers)


def _out_of_band(_: pickle.PickleBuffer) -> bool:
    return False  # array data is not copied when checking that an element pickles


def _elements_before_failure(
    ds: MapDataset[Any], start: int, k: int, exc: Exception | SystemExit
) -> tuple[list[Any], Exception | SystemExit | None]:
    """Elements `[start, start + k)` one at a time, up to the first that raises; with its
    exception (None if each element alone succeeds)."""
    if k == 1:
        return [], exc
    items: list[Any] = []
    for i in range(start, start + k):
        try:
            items.extend(ds._getitems(np.array([i], dtype=np.int64)))
        except (Exception, SystemExit) as e:
            return items, e
    return items, None


def _exit_as_error(exc: SystemExit, index: int) -> RuntimeError:
    """A `sys.exit()` in a worker, as the main process receives it: a RuntimeError (as
    Grain's, whose worker process dies) naming the exit code and the element."""
    error = RuntimeError(
        f"chute: computing the element at index {index}, the worker process called "
        f"sys.exit() with exit code {exc.code!r}. A transform cannot end the program from "
        "a worker; raise an exception instead. (In Grain's words: Worker process was "
        f"terminated unexpectedly with exit code {exc.code!r}.)"
    )
    error.__cause__ = exc
    return error


def _compute_for_workers(ds: MapDataset[Any], start: int) -> list[Any]:
    """Element `start`, computed in this process for the workers (while they start): a
    `sys.exit()` in it is reported as from a worker, not ending this program."""
    try:
        return getitems_exact(ds, start, 1)[0]
    except SystemExit as e:
        raise _exit_as_error(e, start) from e


class _Ticket:
    __slots__ = ("cold", "discarded", "result", "task", "worker")

    def __init__(self, worker: int, task: tuple[Any, ...]) -> None:
        self.worker = worker
        self.task = task
        self.result: Any = None
        self.discarded = False
        self.cold = False  # its worker's first result (imports, lazy loads, fresh memory)


class _ChunkService:
    """Sends chunk tasks to workers round-robin and routes results back to their tickets.

    Which worker computes a chunk never affects what the chunk holds; only when it is ready.
    """

    def __init__(
        self,
        leaves: list[MapDataset[Any]],
        streams: list[ShardStream],
        options: MultiprocessingOptions,
        worker_init_fn: Callable[[int, int], None] | None,
    ) -> None:
        self._shared: list[Any] = []
        leaves = [_for_workers(leaf, self._shared) for leaf in leaves]
        stages: list[Any] = [n for leaf in leaves for n in stages_sources_first(leaf)]
        stages += [shard for stream in streams for shard in stream.shards]
        observer = observe.observing()
        self._merge_figures = observer.figures_merger(leaves) if observer is not None else None
        payload = pipeline_pickle.dumps((leaves, streams), stages)
        self._shard_worker: dict[tuple[int, int], int] = {}  # (stream, shard) -> its worker
        shard_requests = min(4096, 2 * sum(len(stream.shards) for stream in streams))
        self.tuning: autotune.Tuning | None = None
        self._climb: autotune.HillClimb | None = None
        if options.num_workers is AUTOTUNE:
            self._workers = autotuned_workers()
            self.tuning = autotune.Tuning()
            self.tuning.note(
                "num_workers",
                self._workers,
                f"{autotune.usable_cores()} usable cores, memory for "
                f"{autotune.memory_budget() // _WORKER_BYTES} workers of 256 MiB",
            )
        else:
            self._workers = options.num_workers
        self._active = self._workers  # workers given chunks (AUTOTUNE may use fewer)
        self._results = 0
        self._several_leaves = len(leaves) > 1
        self._stall_warning_s = options.stall_warning_s
        self._timeout_s = options.timeout_s
        per_worker = options.per_worker_buffer_size + 1
        self.max_outstanding = max(2, self._workers * options.per_worker_buffer_size)
        self._pool: WorkerPool[tuple[Any, ...], Any] = WorkerPool(
            self._workers,
            _ChunkWorker(payload),
            worker_init_fn=_ShippedInit.of(worker_init_fn),
            buffer_size=per_worker * max(1, len(leaves)) + self.max_outstanding + shard_requests,
        )
        self._queues: list[deque[_Ticket]] = [deque() for _ in range(self._workers)]
        self._shards_held = [0] * self._workers  # shards each worker was given
        self._received = [False] * self._workers
        self.warm = False  # a reader has had an element computed by itself, or a result
        self._next_worker = 0
        # Workers start now, not at the first `next` (they import and unpickle the pipeline
        # while the caller restores a state or its model, as PyTorch's start at `iter`),
        # and from a thread: starting them waits for the forkserver to finish its imports,
        # and `iter()` need not.
        self._start_error: BaseException | None = None
        # Only while the first pool waits for the forkserver's imports, and only when no
        # worker_init_fn sets up what elements may need in a worker.
        self._helper: StartupHelper | None = None
        if worker_init_fn is None and self._pool.start_method == "forkserver" and forkserver_cold():
            self._helper = StartupHelper(
                lambda: self.started, forkserver_starting_s, _TARGET_CHUNK_S
            )
        self._starter: threading.Thread | None = threading.Thread(
            target=self._start_workers, name="chute-start-workers", daemon=True
        )
        self._starter.start()

    def _start_workers(self) -> None:
        try:
            self._pool.start()
        except BaseException as e:
            self._start_error = e

    def _started(self) -> None:
        """Waits for the workers to be started (not ready); raises what starting raised."""
        if self._starter is None:
            return
        self._starter.join()
        self._starter = None
        if self._start_error is not None:
            error, self._start_error = self._start_error, None
            raise error

    def start(self) -> None:
        self._started()

    def computes_here(self) -> bool:
        """Whether this process computes the elements it asks for (see `WorkerChunks`):
        while the workers of the program's first pool are starting."""
        helper = self._helper
        if helper is not None and (helper.stuck or self.started):
            helper.close()
            self._helper = helper = None
        return helper is not None

    def computed_here_s(self, seconds: float) -> None:
        """Tells the startup helper how long an element computed in this process took."""
        if self._helper is not None:
            self._helper.measured(seconds, 1)

    def count_here(self, most: int) -> int:
        """How many elements (at most `most`) to compute next on the startup helper's
        thread; 0 if the workers are started first (see `mp_startup`)."""
        return self._helper.size(most) if self._helper is not None else 0

    def compute_here(
        self, fn: Callable[[], Any], count: int, on_started: Callable[[], None] | None = None
    ) -> Any | None:
        """`fn()`, computing `count` elements, on the startup helper's thread
        (`mp_startup`); None if it failed."""
        if self._helper is None:
            return None
        return self._helper.compute(fn, count, on_started)

    @property
    def started(self) -> bool:
        """Whether the workers are started (so `submit` does not wait for them)."""
        return self._starter is None or not self._starter.is_alive()

    @property
    def active(self) -> int:
        """The workers given chunks now (AUTOTUNE may use fewer than it started)."""
        return self._active

    def observe(self, elements: int) -> None:
        """The consumer took `elements` more: AUTOTUNE's measure of the rate."""
        if self.tuning is None or self._workers == 1:
            return
        self._results += 1
        if self._climb is None:
            # Measure from the first result of every worker on: start-up is not the rate.
            if self._results < 2 * self._workers:
                return
            self._climb = autotune.HillClimb(
                "active workers",
                list(range(1, self._workers + 1)),
                self._workers,
                self.tuning,
                "elements",
            )
            return
        self._active = self._climb.observe(elements)

    def submit(self, leaf: int, start: int, k: int) -> _Ticket:
        self._started()
        w = self._next_worker
        self._next_worker = (w + 1) % self._active
        ticket = _Ticket(w, (leaf, start, k))
        self._pool.put(w, ticket.task)
        self._queues[w].append(ticket)
        return ticket

    def submit_stream(self, task: tuple[Any, ...]) -> _Ticket:
        """Asks for steps of a shard (`mp_shards`) from the worker that has read it before
        (which then replaces the copy it has open when the request brings a state to start
        from), or first from the worker with the fewest shards (then the fewest requests
        waiting). Shards are opened one after the other, each once the one before has
        given its first element, so queues are often equally empty: by queue length alone,
        the first worker would take nearly every shard while the others idle."""
        self._started()
        key = (task[1], task[2])
        w = self._shard_worker.get(key)
        if w is None:
            held = self._shards_held
            w = min(range(self._workers), key=lambda i: (held[i], len(self._queues[i])))
            self._shard_worker[key] = w
            held[w] += 1
        ticket = _Ticket(w, task)
        self._pool.put(w, ticket.task)
        self._queues[w].append(ticket)
        return ticket

    def stream_result(self, ticket: _Ticket) -> tuple[float, list[Any], bool, BaseException | None]:
        """`(seconds, steps, ended, exception)` of a request made with `submit_stream`."""
        elapsed, steps, ended, failure = self._wait(ticket)
        if failure is None:
            return elapsed, steps, ended, None
        exc = failure.rebuild()
        exc.add_note(f"chute: raised in worker {ticket.worker} of {self._workers}")
        return elapsed, steps, ended, exc

    def result(self, ticket: _Ticket) -> tuple[float, list[Any], BaseException | None]:
        """`(seconds, elements, exception)`: the chunk's elements, or those before the
        one that raised and that one's exception (re-created here)."""
        elapsed, items, figures, failure = self._wait(ticket)
        if figures and self._merge_figures is not None:  # measured in the worker (debug mode)
            self._merge_figures(figures)
        if failure is None:
            return elapsed, items, None
        exc = failure.rebuild()
        exc.add_note(f"chute: raised in worker {ticket.worker} of {self._workers}")
        return elapsed, items, exc

    def _wait(self, ticket: _Ticket) -> Any:
        """The result of `ticket`, receiving those before it from its worker."""
        self._started()
        queue = self._queues[ticket.worker]
        while ticket.result is None:
            oldest = queue.popleft()
            try:
                oldest.result = self._get(oldest)
            except WorkerDiedError as e:
                if not self._received[ticket.worker]:
                    e.add_note(_DIED_AT_START)
                raise
            oldest.cold = not self._received[ticket.worker]
            self._received[ticket.worker] = True
            self.warm = True
        out, ticket.result = ticket.result, None
        return out

    def _get(self, ticket: _Ticket) -> Any:
        """The pool's next result from `ticket`'s worker (which is computing `ticket`),
        warning while it stalls and giving up after the timeout."""
        warn_every, limit = self._stall_warning_s, self._timeout_s
        next_warning = warn_every
        t0 = time.monotonic()
        while True:
            marks = [m for m in (next_warning, limit) if m is not None]
            wait = max(0.0, min(marks) - (time.monotonic() - t0)) if marks else None
            try:
                return self._pool.get(ticket.worker, timeout=wait)
            except TimeoutError:
                if self._pool.closed:
                    raise  # the worker's own TimeoutError, not ours
            waited = time.monotonic() - t0
            if limit is not None and waited >= limit:
                who, stack = self._describe(ticket), self._stack(ticket.worker)
                self.close()
                raise WorkerTimeoutError(
                    f"{who} produced nothing for {waited:.1f} s, the "
                    f"MultiprocessingOptions(timeout_s={limit}). Fix what its stack below "
                    "shows it waiting on (a lock, a network call, an endless loop), or give "
                    "a larger timeout_s (None waits as long as it takes). The workers are "
                    f"stopped. {stack}",
                    worker_index=ticket.worker,
                )
            if next_warning is not None and warn_every is not None and waited >= next_warning:
                next_warning += warn_every
                warnings.warn(
                    f"chute: {self._describe(ticket)} has produced nothing for {waited:.0f} s. "
                    "If it is stuck, its stack below shows where; if the work is just slow, "
                    "raise MultiprocessingOptions(stall_warning_s=...) above "
                    f"{warn_every} (None turns this warning off). {self._stack(ticket.worker)}",
                    WorkerStallWarning,
                    stacklevel=2,
                )

    def _describe(self, ticket: _Ticket) -> str:
        if ticket.task[0] == _STREAM:
            where = f"reading shard {ticket.task[2]} of a stream"
        else:
            leaf, start, k = ticket.task
            where = (
                f"element index {start}"
                if k == 1
                else f"element indices {start} to {start + k - 1}"
            )
            if self._several_leaves:
                where += f" of to_iter_dataset input {leaf}"
        pids = self._pool.pids
        pid = f" (pid {pids[ticket.worker]})" if ticket.worker < len(pids) else ""
        return f"worker {ticket.worker} of {self._workers}{pid}, computing {where},"

    def _stack(self, worker: int) -> str:
        stack = self._pool.stack(worker)
        if stack is None:
            return (
                "No stack: the worker has not started running chute's code yet (it is "
                "still importing the main module or unpickling the pipeline)."
            )
        return f"Its Python stack, most recent call first:\n{stack}"

    def discard(self, ticket: _Ticket) -> None:
        """Drops a ticket whose result is no longer wanted (after `set_state`)."""
        ticket.discarded = True
        self._started()
        queue = self._queues[ticket.worker]
        while ticket in queue:
            oldest = queue.popleft()
            result = self._get(oldest)
            if not oldest.discarded:  # another reader's, still wanted: kept for it
                oldest.result = result
            if oldest is ticket:
                break

    def close(self) -> None:
        if self._helper is not None:
            self._helper.close()
            self._helper = None
        try:
            self._started()
        except BaseException:
            pass  # the pool is closed all the same; the error was or will be raised
        self._pool.close()
        for shared in self._shared:
            shared.unlink()


def _for_workers(ds: MapDataset[Any], made: list[Any]) -> MapDataset[Any]:
    """`ds` as the workers receive it: each node's `for_workers` (large in-memory lists
    shared through shared memory rather than pickled into every worker)."""
    return rewrite_graph(ds, lambda node: node.for_workers(made))


def _first_unpicklable(values: list[Any]) -> tuple[int, Exception] | None:
    """The position of the first of `values` that cannot be pickled, and why; None if
    every one can."""
    for k, value in enumerate(values):
        try:
            pickle.dumps(value, protocol=5, buffer_callback=_out_of_band)
        except Exception as e:
            return k, e
    return None
