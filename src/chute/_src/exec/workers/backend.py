"""`ChunkBackend`: what the readers (`feeding.WorkerChunks`) and shard streams
(`shards.WorkerShard`) fed by `mp_prefetch` ask of the service that runs their tasks.

The options object given to `mp_prefetch` builds its service: `options.start_service(
leaves, streams, worker_init_fn, pipeline)`, so a new kind of workers is one more options
class and service, with no edit in the stage or the rewrite. `MultiprocessingOptions`
starts `service.ChunkService` (worker processes on this machine), `RayWorkers`
`chute._src.exec.ray.service.RayService` (the actors of a Ray cluster). Tasks and results
are `tasks.py`'s, computed by `worker.ChunkWorker` in either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from chute._src.exec import autotune
    from chute._src.exec.workers.service import Ticket
    from chute._src.exec.workers.startup import StartupHelper
    from chute._src.exec.workers.tasks import ChunkResult, ShardResult, ShardTask


class ChunkBackend(Protocol):
    """Sends tasks to workers and hands their results back, per ticket.

    Called from several threads at once: each reader and shard stream may be advanced on
    a thread of its own (`prefetch(n)` branches mixed or zipped, the copies of
    `sequential_slice=True`). An implementation serializes its calls (one lock held
    through each, as `ChunkService` and `RayService` do), except `close`, which never
    waits for one."""

    workers: int
    """The workers computing tasks now."""
    warm: bool
    """A reader has had an element computed by itself, or a result from a worker."""

    @property
    def tuning(self) -> autotune.Tuning | None:
        """What AUTOTUNE chose (the number of workers), or None."""

    @property
    def target_chunk_s(self) -> float:
        """About how long a chunk should take a worker to compute."""

    @property
    def max_outstanding(self) -> int:
        """Chunks a reader may have asked for and not yet consumed."""

    @property
    def started(self) -> bool:
        """Whether `submit` can send without waiting for the workers to be started."""

    def startup_helper(self) -> StartupHelper | None:
        """A thread computing elements here while the workers start, or None."""

    def start(self) -> None:
        """Waits for the workers to be started; raises what starting them raised."""

    def submit(self, leaf: int, start: int, k: int) -> Ticket:
        """Asks for elements `[start, start + k)` of leaf `leaf`."""

    def submit_stream(self, task: ShardTask) -> Ticket:
        """Asks for steps of a shard."""

    def result(self, ticket: Ticket) -> tuple[ChunkResult, BaseException | None]:
        """A chunk's elements, or those before the one that raised and its exception."""

    def stream_result(self, ticket: Ticket) -> tuple[ShardResult, BaseException | None]:
        """A shard request's steps, and the exception that stopped the shard, if one did."""

    def discard(self, ticket: Ticket) -> None:
        """Drops a ticket whose result is no longer wanted."""

    def close(self) -> None:
        """Stops the workers for good."""
