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

import copy
import pickle
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from chute._src import config, pipeline_pickle
from chute._src.dataset import IterDataset, MapDataset, _Node, stages_sources_first
from chute._src.iter.filter import FilterIterDataset
from chute._src.iter.map import MapIterDataset
from chute._src.iter.prefetch import PrefetchDatasetIterator, PrefetchIterDataset
from chute._src.iterator import DatasetIterator, child_iterators
from chute._src.map.source import SourceMapDataset
from chute._src.mp._worker import EXIT_NO_MAIN_GUARD
from chute._src.mp.errors import WorkerDiedError, WorkerStallWarning, WorkerTimeoutError
from chute._src.mp.pool import WorkerPool
from chute._src.mp.transport import RemoteFailure
from chute._src.options import MultiprocessingOptions, ReadOptions
from chute._src.sources.shared_list import SharedListSource
from chute._src.stats import nbytes

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


class MultiprocessPrefetchIterDataset(IterDataset[T]):
    """Runs `parent`'s random-access part in `options.num_workers` worker processes."""

    def __init__(
        self,
        parent: IterDataset[T],
        options: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], None] | None = None,
    ) -> None:
        super().__init__([parent])
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
        self._options = options or MultiprocessingOptions(num_workers=_default_workers())
        self._worker_init_fn = worker_init_fn

    @property
    def options(self) -> MultiprocessingOptions:
        return self._options

    def _make_iterator(self) -> DatasetIterator[T]:
        if self._options.enable_profiling and not config.get("py_debug_mode"):
            with config.debug_mode_here():  # the stages below record and print statistics
                return self._make_unprofiled_iterator()
        return self._make_unprofiled_iterator()

    def _make_unprofiled_iterator(self) -> DatasetIterator[T]:
        parent: IterDataset[T] = self._parents[0]  # type: ignore[assignment]
        if self._options.num_workers == 0:
            return _MultiprocessIterator(parent._iter(), None)
        leaves: list[MapDataset[Any]] = []
        main_chain = _substitute(parent, leaves)
        if not leaves:
            warnings.warn(
                f"mp_prefetch: {parent!r} has no random-access part (a MapDataset turned into "
                "an IterDataset with to_iter_dataset) for workers to compute, so it runs in "
                "this process; build the expensive steps on a MapDataset to use workers.",
                stacklevel=2,
            )
            return _MultiprocessIterator(parent._iter(), None)
        service = _ChunkService(leaves, self._options, self._worker_init_fn)
        return _MultiprocessIterator(_attach(main_chain, service), service)

    def __repr__(self) -> str:
        return f"MultiprocessPrefetchIterDataset(num_workers={self._options.num_workers})"


def _default_workers() -> int:
    import os

    return max(1, (os.cpu_count() or 1))


class _MultiprocessIterator(DatasetIterator[T]):
    """The stage the user holds; its state is its parent's, whatever the worker count."""

    stage = "mp_prefetch"

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
        except WorkerDiedError as e:
            self.close()
            if e.exitcode == EXIT_NO_MAIN_GUARD:  # the message says all: no chute frames
                raise e.with_traceback(None) from None
            raise
        except BaseException:
            self.close()
            raise

    def _next_many(self, n: int) -> list[T]:
        try:
            return self._parent._next_many(n)
        except WorkerDiedError as e:
            self.close()
            if e.exitcode == EXIT_NO_MAIN_GUARD:
                raise e.with_traceback(None) from None
            raise
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


# -- rewriting the pipeline: leaves fed by workers, element-wise stages moved into them ------


def _substitute(ds: IterDataset[Any], leaves: list[MapDataset[Any]]) -> IterDataset[Any]:
    """A copy of `ds` whose `to_iter_dataset` leaves read from workers (see module doc)."""
    hoisted: list[IterDataset[Any]] = []
    node: _Node = ds
    while isinstance(node, MapIterDataset | FilterIterDataset):
        hoisted.append(node)
        node = node._parents[0]
    if isinstance(node, PrefetchIterDataset):
        mapped: MapDataset[Any] = node.map_parent
        for stage in reversed(hoisted):
            if isinstance(stage, MapIterDataset):
                mapped = mapped.map(stage._fn)
            else:
                mapped = mapped.filter(stage._fn)
        if config.instrumented():
            from chute._src.instrument import timed_map_chain

            mapped = timed_map_chain(mapped)
        leaves.append(mapped)
        out: IterDataset[Any] = _WorkerFedIterDataset(node, len(leaves) - 1, mapped)
        for stage in reversed(hoisted):
            out = _DoneInWorkers(out, "map" if isinstance(stage, MapIterDataset) else "filter")
        return out
    clone = copy.copy(ds)
    clone._parents = tuple(
        _substitute(p, leaves) if isinstance(p, IterDataset) else p for p in ds._parents
    )
    return clone


def _attach(ds: IterDataset[Any], service: _ChunkService) -> DatasetIterator[Any]:
    """`iter(ds)` with every worker-fed leaf connected to `service`."""
    it = ds._iter()
    stack: list[Any] = [it]
    while stack:
        node = stack.pop()
        if isinstance(node, _WorkerFedIterator):
            node.connect(service)
        stack.extend(child_iterators(node))
    return it


class _DoneInWorkers(IterDataset[Any]):
    """Stands where a `map`/`filter` was that now runs in the workers: a pass-through with
    the same stage name, so the state has the same shape as without workers."""

    def __init__(self, parent: IterDataset[Any], stage: str) -> None:
        super().__init__([parent])
        self._stage = stage

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _PassThrough(self._parent_iter(), self._stage)


class _PassThrough(DatasetIterator[Any]):
    def __init__(self, parent: DatasetIterator[Any], stage: str) -> None:
        super().__init__(parent)
        self.stage = stage  # type: ignore[misc]

    def __next__(self) -> Any:
        return next(self._parent)

    def _next_many(self, n: int) -> list[Any]:
        return self._parent._next_many(n)


class _WorkerFedIterDataset(IterDataset[Any]):
    def __init__(
        self, original: PrefetchIterDataset[Any], leaf_id: int, leaf: MapDataset[Any]
    ) -> None:
        super().__init__([original.map_parent])
        self._original = original
        self._leaf_id = leaf_id
        self._leaf = leaf

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _WorkerFedIterator(self._original, self._leaf_id, self._leaf)

    def __repr__(self) -> str:
        return f"{self._original!r} in worker processes"


class _WorkerFedIterator(PrefetchDatasetIterator[Any]):
    """`to_iter_dataset`'s iterator, with chunks computed by worker processes.

    Same state as the in-process iterator (the next index and the fingerprint of the
    original MapDataset), so states move freely between worker counts.
    """

    def __init__(
        self, original: PrefetchIterDataset[Any], leaf_id: int, leaf: MapDataset[Any]
    ) -> None:
        options = ReadOptions(num_threads=1, prefetch_buffer_size=1)
        super().__init__(original.map_parent, options)
        self._leaf = leaf  # what the workers compute: the MapDataset plus moved stages
        self._skip_none = leaf._may_be_none  # filters moved into the workers leave Nones
        self._leaf_id = leaf_id
        self._service: _ChunkService | None = None
        self._chunk = 1  # grows (doubling) from the first result: a fast first element
        # (index, exception): a chunk failed at this index; raised when the consumer
        # has had every element before it.
        self._failure: tuple[int, BaseException] | None = None

    def connect(self, service: _ChunkService) -> None:
        self._service = service

    def _top_up(self) -> None:
        assert self._service is not None, "worker-fed iterator used before connect()"
        limit = self._service.max_outstanding
        while len(self._pending) < limit and self._submitted < self._len:
            start = self._submitted
            k = min(self._chunk, self._len - start)
            self._pending.append((start, k, self._service.submit(self._leaf_id, start, k)))
            self._submitted = start + k

    def map_records(self) -> list[Any]:
        return _records_of(self._leaf)

    def _next_chunk_from_pool(self, start: int) -> list[Any]:
        if self._failure is not None and self._failure[0] == start:
            exc = self._failure[1]
            self._failure = None
            raise exc
        return super()._next_chunk_from_pool(start)

    def _chunk_result(self, start: int, k: int, fut: Any) -> list[Any]:
        assert self._service is not None
        elapsed, items, failure = self._service.result(fut)
        if failure is not None:  # items holds the elements before the failing one
            self._failure = (start + len(items), failure)
        # Chunks aim at ~20 ms of work, but never at more than _CHUNK_BYTES of arrays:
        # large results must fit the workers' shared-memory slabs, or they fall back to
        # pipes. Either way only scheduling changes, never which elements come out.
        per_element = nbytes(items) / max(1, len(items))
        cap = (
            _MAX_CHUNK
            if not per_element
            else max(1, min(_MAX_CHUNK, int(_CHUNK_BYTES // per_element)))
        )
        if elapsed < _TARGET_CHUNK_S / 2 and self._chunk * 2 <= cap:
            self._chunk *= 2
        elif elapsed > _TARGET_CHUNK_S * 2 and self._chunk > 1:
            self._chunk //= 2
        self._chunk = min(self._chunk, cap)
        return items

    def _discard_pending(self) -> None:
        self._failure = None
        if self._service is not None:
            for _, _, ticket in self._pending:
                self._service.discard(ticket)
        self._pending.clear()

    def start_prefetch(self) -> None:
        if not self._closed:
            self._top_up()

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
        self._records: list[Any] = []

    def __call__(self, worker_index: int, num_workers: int, task: tuple[int, int, int]) -> Any:
        if self._leaves is None:
            self._leaves = pipeline_pickle.loads(self._payload)
            self._payload = b""  # the unpickled pipeline is all a worker needs from now on
            self._records = [r for leaf in self._leaves for r in _records_of(leaf)]
            if self._records:  # debug mode: sample the GIL here too
                from chute._src.instrument import _ensure_sampler

                _ensure_sampler()
        leaf, start, k = task
        t0 = time.perf_counter()
        ds = self._leaves[leaf]
        failure: RemoteFailure | None = None
        try:
            items = ds._getitems(np.arange(start, start + k, dtype=np.int64))
        except Exception as e:
            items, exc = _elements_before_failure(ds, start, k, e)
            failure = RemoteFailure.capture(exc) if exc is not None else None
        deltas = [r.take_delta() for r in self._records if r.calls]
        return time.perf_counter() - t0, items, deltas, failure

    def not_picklable(self, task: tuple[int, int, int], result: Any, exc: BaseException) -> Any:
        """Called by the worker when `result` cannot be pickled: the elements before the
        first that cannot, and an error naming that element's index."""
        elapsed, items, deltas, _ = result
        _, start, _ = task
        for position, item in enumerate(items):
            try:
                pickle.dumps(item, protocol=5, buffer_callback=_out_of_band)
            except Exception as e:
                e.add_note(
                    f"chute: the element at index {start + position} cannot be pickled, so it "
                    "cannot be sent from the worker process; make the stages return "
                    "picklable values (no lambdas, generators, open files or locks)"
                )
                return elapsed, items[:position], deltas, RemoteFailure.capture(e)
        raise exc

    def __repr__(self) -> str:
        return "chute worker"


def _out_of_band(_: pickle.PickleBuffer) -> bool:
    return False  # array data is not copied when checking that an element pickles


def _elements_before_failure(
    ds: MapDataset[Any], start: int, k: int, exc: Exception
) -> tuple[list[Any], Exception | None]:
    """Elements `[start, start + k)` one at a time, up to the first that raises; with its
    exception (None if each element alone succeeds)."""
    if k == 1:
        return [], exc
    items: list[Any] = []
    for i in range(start, start + k):
        try:
            items.extend(ds._getitems(np.array([i], dtype=np.int64)))
        except Exception as e:
            return items, e
    return items, None


class _Ticket:
    __slots__ = ("discarded", "result", "task", "worker")

    def __init__(self, worker: int, task: tuple[int, int, int]) -> None:
        self.worker = worker
        self.task = task
        self.result: Any = None
        self.discarded = False


class _ChunkService:
    """Sends chunk tasks to workers round-robin and routes results back to their tickets.

    Which worker computes a chunk never affects what the chunk holds; only when it is ready.
    """

    def __init__(
        self,
        leaves: list[MapDataset[Any]],
        options: MultiprocessingOptions,
        worker_init_fn: Callable[[int, int], None] | None,
    ) -> None:
        self._shared: list[SharedListSource] = []
        leaves = [_share_large_lists(leaf, self._shared) for leaf in leaves]
        stages = [n for leaf in leaves for n in stages_sources_first(leaf)]
        self._records_by_id = {r.id: r for leaf in leaves for r in _records_of(leaf)}
        payload = pipeline_pickle.dumps(leaves, stages)
        self._workers = options.num_workers
        self._several_leaves = len(leaves) > 1
        self._stall_warning_s = options.stall_warning_s
        self._timeout_s = options.timeout_s
        per_worker = options.per_worker_buffer_size + 1
        self.max_outstanding = max(2, self._workers * options.per_worker_buffer_size)
        self._pool: WorkerPool[tuple[int, int, int], Any] = WorkerPool(
            self._workers,
            _ChunkWorker(payload),
            worker_init_fn=worker_init_fn,
            buffer_size=per_worker * max(1, len(leaves)) + self.max_outstanding,
        )
        self._queues: list[deque[_Ticket]] = [deque() for _ in range(self._workers)]
        self._received = [False] * self._workers
        self._next_worker = 0

    def start(self) -> None:
        self._pool.start()

    def submit(self, leaf: int, start: int, k: int) -> _Ticket:
        w = self._next_worker
        self._next_worker = (w + 1) % self._workers
        ticket = _Ticket(w, (leaf, start, k))
        self._pool.put(w, ticket.task)
        self._queues[w].append(ticket)
        return ticket

    def result(self, ticket: _Ticket) -> tuple[float, list[Any], BaseException | None]:
        """`(seconds, elements, exception)`: the chunk's elements, or those before the
        one that raised and that one's exception (re-created here)."""
        queue = self._queues[ticket.worker]
        while ticket.result is None:
            oldest = queue.popleft()
            try:
                oldest.result = self._get(oldest)
            except WorkerDiedError as e:
                if not self._received[ticket.worker] and e.exitcode != EXIT_NO_MAIN_GUARD:
                    e.add_note(_DIED_AT_START)
                raise
            self._received[ticket.worker] = True
        out, ticket.result = ticket.result, None
        elapsed, items, deltas, failure = out
        for delta in deltas:  # statistics measured in the worker (debug mode only)
            self._records_by_id[delta[0]].merge(delta)
        if failure is None:
            return elapsed, items, None
        exc = failure.rebuild()
        exc.add_note(f"chute: raised in worker {ticket.worker} of {self._workers}")
        return elapsed, items, exc

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
        leaf, start, k = ticket.task
        where = (
            f"element index {start}" if k == 1 else f"element indices {start} to {start + k - 1}"
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
        queue = self._queues[ticket.worker]
        while ticket in queue:
            oldest = queue.popleft()
            self._get(oldest)
            if oldest is ticket:
                break

    def close(self) -> None:
        self._pool.close()
        for shared in self._shared:
            shared.unlink()


SHARE_LISTS_FROM = 10_000  # list/tuple sources at least this long are shared, not copied


def _share_large_lists(ds: MapDataset[Any], made: list[SharedListSource]) -> MapDataset[Any]:
    """`ds` with every large list or tuple source replaced by a `SharedListSource`."""
    memo: dict[int, MapDataset[Any]] = {}

    def rewrite(node: MapDataset[Any]) -> MapDataset[Any]:
        if id(node) in memo:
            return memo[id(node)]
        out = node
        if isinstance(node, SourceMapDataset):
            source = node.data_source
            if isinstance(source, list | tuple) and len(source) >= SHARE_LISTS_FROM:
                shared = SharedListSource(source)
                made.append(shared)
                out = SourceMapDataset(shared)
        elif node._parents:
            parents = tuple(rewrite(p) for p in node._parents)
            if any(a is not b for a, b in zip(parents, node._parents)):
                out = copy.copy(node)
                out._parents = parents
        memo[id(node)] = out
        return out

    return rewrite(ds)


def _records_of(leaf: MapDataset[Any]) -> list[Any]:
    from chute._src.instrument import map_records

    return map_records(leaf)
