"""`RayService`: `mp_prefetch`'s chunk service on Ray actors.

It has the interface of `workers.service.ChunkService` (`workers.backend.ChunkBackend`),
so the readers are fed by the same `feeding.WorkerChunks` (chunk sizes, the first element
computed here while the actors start, failures at their element) and shard streams by
the same `shards.WorkerShard`; only where a task runs and how its result comes back
differ:

- A chunk goes to the started actor owing the fewest results; its result is an object in
  Ray's object store, pulled to this node as soon as it is computed (`fetch.py`) and
  handed to the reader when it reaches it (in index order), its arrays views of the
  store. At most `max_outstanding` chunks per reader are asked for and not
  yet consumed (`RayWorkers.max_chunks_in_flight`): the memory results take here.
- An actor lost (killed, crashed, its node removed) is replaced; the chunks it owed are
  sent again to the others, up to `max_chunk_retries` times each. Results it had finished
  are still in the object store and are used; none is counted twice, as the reader asks
  for each index once.
- A shard stays on the actor that opened it; when that actor is lost or retired, the
  shard is opened again on another from the state after the last step received.
- `resize(n)` adds actors or retires some (`resize` below, `chute.ray.resize`).

Which actor computes a chunk never changes what the chunk holds, so the output and the
states are those of the same pipeline with worker processes or with none.

Readers may each be advanced on a thread of their own (`prefetch(n)` branches under one
`mp_prefetch`); as `ChunkService` does, every method that sends, receives or moves work
holds the service's lock (once per chunk, through the wait for its result).
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from chute._src.core import observe
from chute._src.core.dataset import MapDataset, walk
from chute._src.core.iterator import DatasetIterator
from chute._src.exec import autotune
from chute._src.exec.autotune import AUTOTUNE
from chute._src.exec.mp.errors import WorkerDiedError, WorkerStallWarning, WorkerTimeoutError
from chute._src.exec.ray.actor import ActorFailure
from chute._src.exec.ray.connect import connect, system_errors
from chute._src.exec.ray.fetch import FetchAhead
from chute._src.exec.ray.pool import Actor, ActorPool
from chute._src.exec.workers import pipeline_pickle
from chute._src.exec.workers.service import Ticket
from chute._src.exec.workers.shards import ShardStream

if TYPE_CHECKING:
    from chute._src.exec.ray.options import RayWorkers
from chute._src.exec.workers.startup import StartupHelper
from chute._src.exec.workers.tasks import ChunkResult, ChunkTask, ShardResult, ShardTask, Task
from chute._src.exec.workers.watchdog import STILL_WAITING, wait_bounded
from chute._src.exec.workers.worker import ShippedInit


class RayTicket(Ticket):
    """A task, the actor computing it and the ref of its result (None: not sent yet)."""

    __slots__ = ("actor", "checked", "ref", "tries")

    def __init__(self, task: Task) -> None:
        super().__init__(-1, task)
        self.actor: Actor | None = None
        self.ref: Any = None
        self.tries = 0  # times its actor was lost while computing it
        self.checked = False  # asked again with its result checked for what cannot pickle


class _Shard:
    """One shard of a stream: the actor holding it open, the state after the last step
    received (where another actor opens it), and its requests not yet received."""

    __slots__ = ("actor", "resume", "tickets")

    def __init__(self) -> None:
        self.actor: Actor | None = None
        self.resume: Any = None
        self.tickets: deque[RayTicket] = deque()


class RayService:
    """Starts the actors of one `mp_prefetch` iterator, sends them tasks, and hands the
    results back in the order they are asked for (see the module's docstring)."""

    def __init__(
        self,
        leaves: list[MapDataset[Any]],
        streams: list[ShardStream],
        options: RayWorkers,
        worker_init_fn: Callable[[int, int], None] | None,
    ) -> None:
        # Leaves are pickled as they are: nothing is put in this machine's shared memory,
        # which actors on other nodes could not map.
        stages: list[Any] = [n for leaf in leaves for n in walk(leaf)]
        stages += [shard for stream in streams for shard in stream.shards]
        payload = pipeline_pickle.dumps((leaves, streams), stages, "RayWorkers: stage")
        self._ray = ray = connect(options.address)
        self._lost = system_errors(ray)
        self._task_error: type[BaseException] = ray.exceptions.RayTaskError
        self._timeout_error: type[BaseException] = ray.exceptions.GetTimeoutError
        observer = observe.observing()
        observed = [*leaves, *(n for stream in streams for n in stream.observed())]
        self._merge_figures = observer.figures_merger(observed) if observer is not None else None
        self._options = options
        self.tuning: autotune.Tuning | None = None
        if options.num_workers is AUTOTUNE:
            count = self._autotuned_workers()
        else:
            count = options.num_workers
        self.workers = count
        self.warm = False
        self._several_leaves = len(leaves) > 1
        self._shards: dict[tuple[int, int], _Shard] = {}
        self._closed = False
        self._lock = threading.RLock()  # held by every call that sends or receives
        self._fetch = FetchAhead(ray)  # results pulled to this node as soon as computed
        self._pool = ActorPool(
            ray, options, ray.put(payload), ShippedInit.of(worker_init_fn), count
        )

    def _autotuned_workers(self) -> int:
        cpus = self._options.cpus_per_worker()
        total = float(self._ray.cluster_resources().get("CPU", 1))
        count = max(1, int(total // cpus) if cpus > 0 else int(total))
        self.tuning = autotune.Tuning()
        self.tuning.note(
            "num_workers", count, f"{total:g} CPUs in the Ray cluster, {cpus:g} per actor"
        )
        return count

    # -- what WorkerChunks and WorkerShard use (workers.backend.ChunkBackend) -------------

    @property
    def target_chunk_s(self) -> float:
        return self._options.chunk_s

    @property
    def max_outstanding(self) -> int:
        given = self._options.max_chunks_in_flight
        if given is not None:
            return given
        return max(2, self.workers * self._options.per_worker_buffer_size)

    @property
    def started(self) -> bool:
        return True  # tasks wait in Ray for actors that are starting

    def startup_helper(self) -> StartupHelper | None:
        return None

    def start(self) -> None:
        if self._pool.failure is not None:
            raise self._pool.failure

    def submit(self, leaf: int, start: int, k: int) -> RayTicket:
        ticket = RayTicket(ChunkTask(leaf, start, k))
        with self._lock:
            self._send(ticket, self._choose())
        return ticket

    def submit_stream(self, task: ShardTask) -> RayTicket:
        """A request for steps of a shard: to the actor holding it open, or (a state to
        start from, or that actor gone) to the actor holding the fewest shards."""
        ticket = RayTicket(task)
        with self._lock:
            shard = self._shards.setdefault((task.stream, task.shard), _Shard())
            shard.tickets.append(ticket)
            if task.start is not None:
                if shard.actor is None or not shard.actor.usable:
                    shard.actor = self._actor_for_shard()
                self._send(ticket, shard.actor)
            elif shard.actor is not None and shard.actor.usable:
                self._send(ticket, shard.actor)
            elif shard.tickets[0] is ticket:
                self._move(shard)
            # else: sent once the requests before it are received (`_move`)
        return ticket

    def result(self, ticket: Ticket) -> tuple[ChunkResult, BaseException | None]:
        with self._lock:
            result: ChunkResult = self._wait(ticket)
            if result.figures and self._merge_figures is not None:  # debug mode's figures
                self._merge_figures(result.figures)
        return result, self._rebuilt(result.failure, ticket)

    def stream_result(self, ticket: Ticket) -> tuple[ShardResult, BaseException | None]:
        with self._lock:
            result: ShardResult = self._wait(ticket)
            if result.figures and self._merge_figures is not None:  # debug mode's, from the actor
                self._merge_figures(result.figures)
            task = ticket.task
            assert isinstance(task, ShardTask)
            shard = self._shards[(task.stream, task.shard)]
            shard.tickets.popleft()
            if result.ended or result.failure is not None:
                shard.actor, shard.resume = None, None
            elif result.steps:
                shard.resume = result.steps[-1][1]
        return result, self._rebuilt(result.failure, ticket)

    def discard(self, ticket: Ticket) -> None:
        assert isinstance(ticket, RayTicket)
        with self._lock:
            ticket.discarded = True
            # A chunk not started is dropped by Ray; a shard's request is not (the actor
            # keeps the shard open between requests: the next request after a discard
            # brings a state).
            self._forget(ticket, cancel=isinstance(ticket.task, ChunkTask))
            if isinstance(ticket.task, ShardTask):
                shard = self._shards.get((ticket.task.stream, ticket.task.shard))
                if shard is not None and ticket in shard.tickets:
                    shard.tickets.remove(ticket)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fetch.close()
        try:
            if self._ray.is_initialized():
                self._pool.close()
        except Exception:
            pass  # Ray is shutting down (interpreter exit): it ends the actors itself

    # -- elasticity -------------------------------------------------------------------

    def resize(self, num_workers: int) -> None:
        """`num_workers` actors from now on (see `chute.ray.resize`)."""
        with self._lock:
            self._pool.resize(num_workers)
            self.workers = num_workers

    # -- sending and receiving ------------------------------------------------------------

    def _choose(self) -> Actor:
        self._take_in_started()
        return self._pool.choose()

    def _take_in_started(self) -> None:
        for actor in self._pool.poll(self._lost):
            self._resend_chunks_of(actor)
        self.start()  # chute's code failed in an actor: raised here

    def _actor_for_shard(self) -> Actor:
        self._take_in_started()
        held: dict[int, int] = {}
        for shard in self._shards.values():
            if shard.actor is not None:
                held[id(shard.actor)] = held.get(id(shard.actor), 0) + 1
        usable = [a for a in self._pool.actors if a.usable]
        ready = [a for a in usable if a.ready] or usable
        return min(ready, key=lambda a: (held.get(id(a), 0), len(a.tickets)))

    def _send(self, ticket: RayTicket, actor: Actor, task: Task | None = None) -> None:
        ticket.actor, ticket.worker = actor, actor.slot
        ticket.ref = actor.handle.run.remote(task or ticket.task, ticket.checked)
        actor.tickets[ticket] = None
        self._fetch.add(ticket.ref)

    def _forget(self, ticket: RayTicket, cancel: bool = False) -> None:
        """The ticket's result is no longer awaited from its actor (which the ticket still
        names, for messages)."""
        actor, ref = ticket.actor, ticket.ref
        ticket.ref = None
        if ref is not None:
            self._fetch.drop(ref)
        if actor is not None:
            actor.tickets.pop(ticket, None)
            self._pool.reap(actor)
        if cancel and ref is not None:
            try:
                self._ray.cancel(ref)  # a task not started yet is dropped (no force: never kills)
            except Exception:
                pass

    def _move(self, shard: _Shard, actor: Actor | None = None) -> None:
        """Opens `shard` on `actor` (else the actor holding the fewest shards) from the
        state after the last step received, and sends it the shard's requests not yet
        received, in order."""
        shard.actor = actor or self._actor_for_shard()
        for i, ticket in enumerate(shard.tickets):
            task = ticket.task
            assert isinstance(task, ShardTask)
            self._forget(ticket, cancel=True)
            if i == 0 and task.start is None:
                assert shard.resume is not None, "a shard's first request brings a state"
                task = ShardTask(task.stream, task.shard, shard.resume, task.n, task.steps)
            self._send(ticket, shard.actor, task)

    def _resend_chunks_of(self, actor: Actor) -> None:
        """Sends the chunks a lost actor owed, not finished, to the others."""
        owed = [t for t in actor.tickets if isinstance(t.task, ChunkTask)]
        if not owed:
            return
        refs = [t.ref for t in owed]
        finished = set(self._ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        for ticket in owed:
            if ticket.ref not in finished:
                self._retry(ticket, None)

    def _retry(self, ticket: RayTicket, error: BaseException | None) -> None:
        """Sends `ticket`'s task again, to another actor, after its actor was lost."""
        lost_actor = ticket.actor
        self._forget(ticket)
        ticket.tries += 1
        if ticket.tries > self._options.max_chunk_retries:
            where = ticket.task.describe(self._several_leaves)
            who = lost_actor.describe(self.workers) if lost_actor is not None else "an actor"
            raise WorkerDiedError(
                f"chute: {who} was lost computing {where}, for the "
                f"{ticket.tries}th time (RayWorkers(max_chunk_retries="
                f"{self._options.max_chunk_retries})): the work may kill the actor (native "
                f"code crashing, memory): {error}",
                worker_index=ticket.worker,
                exitcode=None,
            ) from error
        if isinstance(ticket.task, ChunkTask):
            self._send(ticket, self._choose())
        # a shard's request is sent again by `_wait`, once it is the shard's first

    def _wait(self, ticket: Ticket) -> Any:
        """The result of `ticket`; a request lost with its actor is computed again."""
        assert isinstance(ticket, RayTicket)
        while True:
            if isinstance(ticket.task, ShardTask) and (
                ticket.ref is None or ticket.actor is None or ticket.actor.dead
            ):
                shard = self._shards[(ticket.task.stream, ticket.task.shard)]
                assert shard.tickets[0] is ticket, "a shard's requests are received in order"
                self._move(shard)  # every request before it is received: `resume` is exact
            actor = ticket.actor
            assert actor is not None and ticket.ref is not None
            try:
                value = self._get(ticket)
            except self._lost as e:
                self._pool.lost(actor, e)
                self._retry(ticket, e)
                self._resend_chunks_of(actor)
                continue
            except self._task_error as e:
                if not ticket.checked:  # its result could not be sent: asked again, checked
                    ticket.checked = True
                    again = actor if actor.usable else None
                    if isinstance(ticket.task, ShardTask):  # from the state before it
                        self._move(self._shards[(ticket.task.stream, ticket.task.shard)], again)
                    else:
                        self._forget(ticket)
                        self._send(ticket, again or self._choose())
                    continue
                e.add_note(f"chute: raised in {actor.describe(self.workers)}")
                raise
            self._forget(ticket)
            if isinstance(value, ActorFailure):
                raise value.rebuild(f"Ray actor {actor.slot} of {self.workers}")
            ticket.cold = not actor.received
            actor.received = True
            self.warm = True
            return value

    def _get(self, ticket: RayTicket) -> Any:
        """`ray.get` of the ticket's result, warning while it stalls and giving up after
        `timeout_s` (`MultiprocessingOptions`)."""
        warn_every, limit = self._options.stall_warning_s, self._options.timeout_s

        def attempt(wait: float | None) -> Any:
            try:
                return self._ray.get(ticket.ref, timeout=wait)
            except self._timeout_error:
                return STILL_WAITING

        def give_up(waited: float) -> NoReturn:
            who = self._describe(ticket)
            self.close()
            raise WorkerTimeoutError(
                f"{who} produced nothing for {waited:.1f} s, the "
                f"MultiprocessingOptions(timeout_s={limit}). The actors are stopped.",
                worker_index=ticket.worker,
            )

        def warn(waited: float) -> None:
            warnings.warn(
                f"chute: {self._describe(ticket)} has produced nothing for {waited:.0f} s. "
                "If the work is just slow, raise RayWorkers(stall_warning_s=...) above "
                f"{warn_every} (None turns this warning off).",
                WorkerStallWarning,
                stacklevel=6,
            )

        return wait_bounded(attempt, warn_every, limit, warn, give_up)

    def _describe(self, ticket: RayTicket) -> str:
        self._take_in_started()  # which actors have started since
        actor = ticket.actor
        where = ticket.task.describe(self._several_leaves)
        if actor is None:
            return f"a Ray actor, computing {where},"
        if actor.ready:
            return f"{actor.describe(self.workers)}, computing {where},"
        asked = dict(self._options.resources_per_worker or {"CPU": 1})
        free = self._ray.available_resources()
        who = (
            f"Ray actor {actor.slot} of {self.workers}, asked to compute {where}, has not "
            f"started: Ray has not found a node with {asked} free (free now: "
            f"{ {k: free.get(k, 0) for k in asked} }), or it is still starting; it"
        )
        return who

    def _rebuilt(self, failure: Any, ticket: Ticket) -> BaseException | None:
        if failure is None:
            return None
        exc: BaseException = failure.rebuild()
        actor = ticket.actor if isinstance(ticket, RayTicket) else None
        exc.add_note(
            f"chute: raised in Ray actor {ticket.worker} of {self.workers}"
            + (f" ({actor.place})" if actor is not None and actor.place is not None else "")
        )
        return exc


def resize(iterator: DatasetIterator[Any], num_workers: int) -> None:
    """Gives the Ray workers of `iterator` (an iterator of a pipeline with
    `mp_prefetch(RayWorkers(...))`) `num_workers` actors from now on: more are started, or
    some take no new chunk and end once the results they owe are consumed. The output
    and the states do not change."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(
            f"chute.ray.resize: num_workers={num_workers!r} is invalid: it must be an int "
            ">= 1; e.g. chute.ray.resize(it, 4)."
        )
    found = _services(iterator)
    if not found:
        raise ValueError(
            f"chute.ray.resize: {iterator!r} has no Ray workers: it is not an iterator of a "
            "pipeline with mp_prefetch(chute.ray.RayWorkers(...)) (or it was closed)."
        )
    for service in found:
        service.resize(num_workers)


def _services(iterator: DatasetIterator[Any]) -> list[RayService]:
    """The open Ray services of `iterator`'s `mp_prefetch` stages, each once (a wrapper
    such as the thread guard shows its iterator's attributes as its own)."""
    out: dict[int, RayService] = {}
    stack, seen = [iterator], set()
    while stack:
        it = stack.pop()
        if id(it) in seen:
            continue
        seen.add(id(it))
        service = getattr(it, "_service", None)
        if isinstance(service, RayService) and not service._closed:
            out[id(service)] = service
        stack.extend(it.children())
    return list(out.values())
