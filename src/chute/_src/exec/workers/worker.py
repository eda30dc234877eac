"""The code each worker process runs: it unpickles the pipeline once, then computes the
tasks (`tasks.py`) the main process sends.

A chunk whose elements share one structure of same-shaped arrays goes back as `Columns`
(`core/columns.py`): one array per leaf. A chunk whose element raises is recomputed one element at a time by
`executors.elements_before_failure`, the reader's path in one process too: the result
holds the elements before the failing one and its exception, so the consumer receives
every element before it, whatever the number of workers. A shard's
steps are read by `shards.ShardReader`.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from chute._src.core import observe
from chute._src.core.columns import columns_of
from chute._src.core.dataset import MapDataset
from chute._src.exec.executors import elements_before_failure
from chute._src.exec.mp.transport import RemoteFailure
from chute._src.exec.workers import pipeline_pickle
from chute._src.exec.workers.shards import ShardReader
from chute._src.exec.workers.tasks import ChunkResult, ChunkTask, ShardResult, ShardTask, Task


class ChunkWorker:
    """The function each worker runs on its tasks: a `ChunkResult` for a `ChunkTask`, a
    `ShardResult` for a `ShardTask`."""

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

    def _load(self) -> tuple[list[MapDataset[Any]], ShardReader]:
        if self._leaves is None or self._shards is None:
            self._leaves, streams = pipeline_pickle.loads(self._payload)
            self._payload = b""  # the unpickled pipeline is all a worker needs from now on
            # Unpickling a pipeline built in debug mode installed the debug layer's observer.
            observer = observe.current()
            if observer is not None:
                observed = [*self._leaves, *(n for s in streams for n in s.observed())]
                self._take_figures = observer.worker_start(observed)
            self._shards = ShardReader(streams, self._take_figures)
        return self._leaves, self._shards

    def __call__(self, worker_index: int, num_workers: int, task: Task) -> Any:
        leaves, shards = self._load()
        match task:
            case ShardTask():
                return shards(task)
            case ChunkTask(leaf, start, k):
                t0 = time.perf_counter()
                ds = leaves[leaf]
                failure: RemoteFailure | None = None
                try:
                    items = ds._getitems(np.arange(start, start + k, dtype=np.int64))
                except (Exception, SystemExit) as e:
                    items, exc = elements_before_failure(ds, start, k, e, (Exception, SystemExit))
                    if isinstance(exc, SystemExit):
                        exc = exit_as_error(exc, start + len(items))
                    failure = RemoteFailure.capture(exc) if exc is not None else None
                figures = self._take_figures() if self._take_figures is not None else []
                # Elements of one structure of same-shaped arrays go as one array per leaf.
                block = columns_of(items) if failure is None else None
                return ChunkResult(
                    time.perf_counter() - t0, items if block is None else block, figures, failure
                )
        raise TypeError(f"chute worker: {task!r} is not a task")

    def not_picklable(self, task: Task, result: Any, exc: BaseException) -> Any:
        """Called by the worker when `result` cannot be pickled: the elements before the
        first that cannot, and an error naming that element's index."""
        fix = (
            "cannot be sent from the worker process; make the stages return picklable "
            "values (no lambdas, generators, open files or locks)"
        )
        match task, result:
            case ShardTask(), ShardResult():  # a shard's steps: stop before the one that cannot go
                found = first_unpicklable([items for items, _ in result.steps])
                if found is None:
                    raise exc
                n, e = found
                e.add_note(
                    f"chute: an element of shard {task.shard} cannot be pickled, so it {fix}"
                )
                return ShardResult(
                    result.seconds, result.steps[:n], True, RemoteFailure.capture(e), result.figures
                )
            case ChunkTask(), ChunkResult():
                found = first_unpicklable(list(result.items))
                if found is None:
                    raise exc
                position, e = found
                e.add_note(
                    f"chute: the element at index {task.start + position} cannot be pickled, "
                    f"so it {fix}"
                )
                return ChunkResult(
                    result.seconds,
                    list(result.items[:position]),
                    result.figures,
                    RemoteFailure.capture(e),
                )
        raise exc

    def __repr__(self) -> str:
        return "chute worker"


class ShippedInit:
    """`worker_init_fn` pickled as the pipeline is (by value, so closures and lambdas
    work), called in each worker."""

    def __init__(self, payload: bytes) -> None:
        self._payload = payload

    @staticmethod
    def of(fn: Callable[[int, int], None] | None) -> ShippedInit | None:
        if fn is None:
            return None
        return ShippedInit(pipeline_pickle.dumps(fn, [fn], "mp_prefetch: worker_init_fn"))

    def __call__(self, worker_index: int, num_workers: int) -> None:
        pipeline_pickle.loads(self._payload)(worker_index, num_workers)


def exit_as_error(exc: SystemExit, index: int) -> RuntimeError:
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


def _out_of_band(_: pickle.PickleBuffer) -> bool:
    return False  # array data is not copied when checking that an element pickles


def first_unpicklable(values: list[Any]) -> tuple[int, Exception] | None:
    """The position of the first of `values` that cannot be pickled, and why; None if
    every one can."""
    for k, value in enumerate(values):
        try:
            pickle.dumps(value, protocol=5, buffer_callback=_out_of_band)
        except Exception as e:
            return k, e
    return None
