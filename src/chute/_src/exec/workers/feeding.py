"""`WorkerChunks`: the chunk executor that feeds a reader (`to_iter_dataset`) from the
workers of a `ChunkBackend` (processes, or Ray actors), in index order, sizing the chunks
it asks for."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

from chute._src.core.columns import Columns
from chute._src.core.dataset import MapDataset
from chute._src.core.tuning import Parallelism
from chute._src.exec.executors import Chunk, ChunkExecutor, getitems_exact, nbytes
from chute._src.exec.workers.backend import ChunkBackend
from chute._src.exec.workers.service import Ticket
from chute._src.exec.workers.startup import compute_beside
from chute._src.exec.workers.worker import exit_as_error, first_unpicklable

_MAX_CHUNK = 4096
_CHUNK_BYTES = 4 << 20


class WorkerChunks(ChunkExecutor):
    """A reader's chunks computed by the worker processes of `service`.

    Chunks `[start, start + k)` are asked for in index order, `k` adapting to the
    service's `target_chunk_s` of work (~50 ms for processes); the reader keeps the
    in-process state (the next index and the fingerprint of the original MapDataset), so
    states move freely between worker counts.

    While no worker has delivered a result yet (they are starting: forking, importing,
    unpickling the pipeline), the first element asked for is computed in the consumer's
    process (on a thread beside the consumer's while the workers start, so that they are
    given the ones after it as soon as they are started), and the workers compute the
    ones after it: the first batch does not wait for the workers' start. Element `i` is
    the same wherever it is computed.

    The first pool of a program also waits for the forkserver's imports (~0.2 s, more with
    the main script's). Until its workers are started, a helper thread of this process
    (`startup.StartupHelper`) goes on computing the elements asked for, in runs sized
    as the workers' chunks are, keeping each run that succeeds and pickles; a run in which
    an element raises or cannot be pickled, or that outlasts the start, is left to the
    workers, which report it as always, and so is the last element, so that workers that
    cannot start (a script without its `__main__` guard) are reported even when the rest
    was computed here. The workers' first chunks are sized from the helper's runs.
    So a batch of cheap elements assembled after this stage (rows of text) does not wait
    for the workers' start either.
    """

    concurrent = True
    # Advanced by one thread at a time (the consumer's, or a prefetch thread's); the service
    # it shares with other readers serializes their calls. Stages that would read it on a
    # pool of threads (an interleave) read it inline: the workers compute ahead already.
    bound_to_thread = True

    def parallelism(self) -> Parallelism:
        return Parallelism(processes=self._service.workers)

    def __init__(self, leaf: MapDataset[Any], leaf_id: int, service: ChunkBackend) -> None:
        super().__init__(leaf)  # what the workers compute: the MapDataset plus moved stages
        self._leaf_id = leaf_id
        self._service = service
        self._pending: deque[tuple[int, int, Ticket]] = deque()
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

    def next_chunk(self, start: int) -> Chunk:
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
                helper = self._service.startup_helper()
                if helper is not None:  # sizes the helper's runs from this element's time
                    helper.measured(time.perf_counter() - begun, 1)
            if self._service.started:
                self._top_up()  # else at the next chunk, which waits for the workers
            return items
        if (
            self._local is None
            and not self._pending
            and self._submitted == start
            and start + 1 < self.length  # the last is the workers': they report a failure
            and not self._closed
            and self._service.startup_helper() is not None
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

    def _result(self, start: int, ticket: Ticket) -> Chunk:
        result, failure = self._service.result(ticket)
        elapsed, items = result.seconds, result.items
        if failure is not None:  # items holds the elements before the failing one
            self._failure = (start + len(items), failure)
        if not ticket.cold:
            # A worker's first chunk pays its one-off costs (a tokenizer loaded on first
            # use, a file's index, fresh memory: 5 times a row's time for text); sized from
            # it, the next chunks would shrink to a few elements and grow back over several
            # results, each a round trip.
            self._resize(items, elapsed, failure is not None)
        return items

    def _resize(self, items: Chunk, elapsed: float, failed: bool) -> None:
        """Sizes the chunks asked for next from `items`, computed in `elapsed` seconds
        (and the one after them, which raised, if `failed`)."""
        # Chunks aim at `target_chunk_s` of work, but never at more than _CHUNK_BYTES of arrays:
        # large results must fit the workers' shared-memory slabs, or they fall back to
        # pipes. Either way only scheduling changes, never which elements come out.
        # From up to 8 elements spread over the chunk: summing every array of every element
        # cost the consumer a fifth of its CPU on seed 003's text (one chunk ~ 200 dicts).
        if isinstance(items, Columns):
            per_element = items.nbytes / len(items)
        else:
            sample = items[:: max(1, len(items) // 8)]
            per_element = nbytes(sample) / max(1, len(sample))
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
            ideal = int(self._service.target_chunk_s * measured / elapsed)
            self._chunk = max(1, min(ideal, 4 * measured, cap))

    def _compute_here(self, start: int) -> list[Any] | None:
        """Elements from `start` on, computed in this process while the workers start;
        None if one raises or cannot be pickled, or if they outlast the start: the
        workers then compute them and report that as they report any failure or stall
        (naming worker and index)."""
        ds = self.ds
        # As many as the helper can likely compute before the workers start, never the
        # last element (see the class's docstring).
        helper = self._service.startup_helper()
        k = helper.size(self.length - 1 - start) if helper is not None else 0
        if helper is None or k == 0:
            return None

        def elements() -> list[Any] | None:
            # One that raises fails the whole run (the helper answers None): the workers
            # compute it again element by element and report the failure.
            items: list[Any] = ds._getitems(np.arange(start, start + k, dtype=np.int64))
            return None if first_unpicklable(items) is not None else items

        # The workers, once started, get the elements after these meanwhile, in chunks
        # sized from the time these took.
        self._submitted = start + k
        begun = time.perf_counter()
        result: list[Any] | None = helper.compute(elements, k, self._top_up)
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


def _compute_for_workers(ds: MapDataset[Any], start: int) -> list[Any]:
    """Element `start`, computed in this process for the workers (while they start): a
    `sys.exit()` in it is reported as from a worker, not ending this program."""
    try:
        return getitems_exact(ds, start, 1)[0]
    except SystemExit as e:
        raise exit_as_error(e, start) from e
