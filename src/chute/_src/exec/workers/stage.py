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

The options object starts the workers (`options.start_service`, `workers/backend.py`):
`MultiprocessingOptions` worker processes, `chute.ray.RayWorkers` (a
`MultiprocessingOptions`) the actors of a Ray cluster (`_src/exec/ray/`): the same rewrite,
readers and tasks, another service.

An `mp_prefetch` inside another's input (`ds.mp_prefetch(a).batch(8).mp_prefetch(b)`)
hands its input on: the outermost one with workers runs the whole pipeline below it in
its own, so each reader and stream is split once (split twice, the inner rewrite would
re-read the readers the outer one had already moved, dropping the stages moved with
them). The elements and states are those of the pipeline with no workers, as always; an
inner `worker_init_fn`, which then never runs, is named in a warning when it is built.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from chute._src.core import config
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, walk
from chute._src.core.iterator import DatasetIterator
from chute._src.core.node import rewrite
from chute._src.core.options import MultiprocessingOptions
from chute._src.core.tuning import Parallelism
from chute._src.exec import autotune
from chute._src.exec.autotune import AUTOTUNE
from chute._src.exec.sequential_slice import sequential_shares
from chute._src.exec.workers.backend import ChunkBackend
from chute._src.exec.workers.rewrite import WorkerPlan

T = TypeVar("T")


class MultiprocessPrefetchIterDataset(IterDataset[T]):
    """Runs `parent`'s random-access part in `options.num_workers` worker processes."""

    def __init__(
        self,
        parent: IterDataset[T],
        options: MultiprocessingOptions | None = None,
        worker_init_fn: Callable[[int, int], None] | None = None,
        sequential_slice: bool = False,
    ) -> None:
        if not isinstance(sequential_slice, bool):
            raise TypeError(
                f"mp_prefetch: sequential_slice={sequential_slice!r} is not a bool: pass True "
                "or False."
            )
        if options is not None and not isinstance(options, MultiprocessingOptions):
            raise TypeError(
                f"mp_prefetch: options={options!r} is not a MultiprocessingOptions: pass "
                "chute.MultiprocessingOptions(num_workers=N) (or chute.ray.RayWorkers(N))."
            )
        workers = options.num_workers if options is not None else AUTOTUNE
        if sequential_slice and isinstance(workers, int) and workers > 1:
            # Grain's order of contiguous shares, one per worker (`sequential_slice.py`).
            parent = sequential_shares(parent, workers, "mp_prefetch")
        super().__init__([parent])
        if worker_init_fn is not None and not callable(worker_init_fn):
            raise TypeError(
                f"mp_prefetch: worker_init_fn={worker_init_fn!r} is not callable: pass a "
                "function f(worker_index, worker_count), or None."
            )
        self._options = options or MultiprocessingOptions(num_workers=AUTOTUNE)
        self._worker_init_fn = worker_init_fn
        if self._options.num_workers != 0:
            _warn_of_inner_init_fns(parent)
        # Grain's workers read strided slices of the source, which for a pipeline that
        # keeps its elements in order gives them in index order, as chute's workers do
        # for any count (they compute chunks of indices, reassembled in index order);
        # sequential_slice=True asked for Grain's order of contiguous shares, built above.
        self._sequential_slice = sequential_slice

    @property
    def options(self) -> MultiprocessingOptions:
        return self._options

    @property
    def _role(self) -> StageRole:  # type: ignore[override]
        # With no workers, it hands its input on and does nothing else.
        return StageRole.PASS_THROUGH if self._options.num_workers == 0 else StageRole.PREFETCH

    @property
    def _concurrent(self) -> bool:
        return self._options.num_workers != 0

    def _make_iterator(self) -> DatasetIterator[T]:
        if self._options.enable_profiling and not config.get("py_debug_mode"):
            with config.debug_mode_here():  # the stages below record and print statistics
                return self._make_unprofiled_iterator()
        return self._make_unprofiled_iterator()

    def _make_unprofiled_iterator(self) -> DatasetIterator[T]:
        parent: IterDataset[T] = self._parents[0]  # type: ignore[assignment]
        if self._options.num_workers == 0:
            return _MultiprocessIterator(parent._iter(), None)
        plan = WorkerPlan(_inner_ones_handed_on(parent))
        if not plan.leaves and not plan.streams:
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
        service: ChunkBackend = self._options.start_service(
            plan.leaves, plan.streams, self._worker_init_fn, parent
        )
        return _MultiprocessIterator(plan.build(service)._iter(), service)

    def __repr__(self) -> str:
        return f"MultiprocessPrefetchIterDataset(num_workers={self._options.num_workers})"


def _inner_ones_handed_on(parent: IterDataset[T]) -> IterDataset[T]:
    """`parent` with every `mp_prefetch` in it replaced by its input (see module doc). Its
    iterator's state is its input's, so the states keep their shape."""

    def hand_on(node: Any) -> Any:
        if isinstance(node, MultiprocessPrefetchIterDataset):  # this stage, nested in itself
            return node._parents[0]
        return node

    return rewrite(parent, hand_on)


def _warn_of_inner_init_fns(parent: IterDataset[Any]) -> None:
    for node in walk(parent):
        if isinstance(node, MultiprocessPrefetchIterDataset) and node._worker_init_fn:
            warnings.warn(
                f"mp_prefetch: worker_init_fn={node._worker_init_fn!r} of an inner "
                "mp_prefetch will not run: the outer mp_prefetch runs the whole pipeline "
                "below it in its own workers, and the inner one hands its input on. Pass the "
                "function to the outer mp_prefetch (worker_init_fn=...), or remove the inner "
                "one.",
                stacklevel=5,  # this, __init__, its wrapper, mp_prefetch, the user's
            )


class _MultiprocessIterator(DatasetIterator[T]):
    """The stage the user holds; its state is its parent's (so the same with any number
    of workers, or without the stage)."""

    stage = "mp_prefetch"
    transparent = True

    def __init__(self, parent: DatasetIterator[T], service: ChunkBackend | None) -> None:
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
        return Parallelism(processes=self._service.workers if self._service is not None else 0)
