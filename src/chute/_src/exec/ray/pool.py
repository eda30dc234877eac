"""The actors of one `RayWorkers` iterator: started, chosen for a task, replaced when they
die, retired when the pool shrinks.

Each actor has a slot, `0 .. num_workers - 1` (`worker_init_fn`'s index): a lost actor's
slot gets a new actor (Ray schedules it where the resources are: another node, or this
one once the cluster has room again). A retired actor takes no new chunk and ends once
the results it owes are received. Actors are never detached: Ray ends them with this
process's job, so a trainer killed with SIGKILL leaves none behind.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

from chute._src.exec.mp.errors import WorkerDiedError
from chute._src.exec.ray.actor import ActorPlace, ChunkActor
from chute._src.exec.workers.worker import ShippedInit

if TYPE_CHECKING:
    from chute._src.exec.ray.options import RayWorkers
    from chute._src.exec.ray.service import RayTicket

_MAX_EARLY_DEATHS = 3
"""Actors dying in a row before any of them started (a runtime_env that cannot be set
up, a node that kills what it starts): then the error is raised."""

_remote_classes: dict[int, Any] = {}  # id(ray) -> ray.remote(ChunkActor)


class Actor:
    """One actor and what chute knows of it."""

    __slots__ = (
        "born",
        "dead",
        "handle",
        "place",
        "prepared",
        "ready",
        "received",
        "retiring",
        "slot",
        "tickets",
    )

    def __init__(self, handle: Any, slot: int, prepared: Any) -> None:
        self.handle = handle
        self.slot = slot
        self.prepared = prepared  # the ref of `prepare()`: ready once the actor runs
        self.ready = False
        self.dead = False
        self.retiring = False
        self.received = False  # a result of it was received (its first is "cold")
        self.place: ActorPlace | None = None
        self.tickets: dict[RayTicket, None] = {}  # sent, not yet received, in order
        self.born = time.monotonic()

    @property
    def usable(self) -> bool:
        return not self.dead and not self.retiring

    def describe(self, count: int) -> str:
        where = str(self.place) if self.place is not None else "not started yet"
        return f"Ray actor {self.slot} of {count} ({where})"


class ActorPool:
    """Starts `count` actors, each given the pickled pipeline (`payload_ref`, one copy in
    the object store) and `init` (`worker_init_fn`)."""

    def __init__(
        self, ray: Any, options: RayWorkers, payload_ref: Any, init: ShippedInit | None, count: int
    ) -> None:
        self._ray = ray
        self._options = options
        self._payload_ref = payload_ref
        self._init = init
        remote = _remote_classes.get(id(ray))
        if remote is None:
            remote = _remote_classes[id(ray)] = ray.remote(ChunkActor)
        self._remote = remote.options(
            **options.actor_resources(), **dict(options.actor_options or {}), max_restarts=0
        )
        self.target = count
        self.actors: list[Actor] = []
        self.failure: BaseException | None = None  # chute's code failed in an actor
        self._early_deaths = 0
        self._turn = itertools.count()
        for slot in range(count):
            self._start(slot)

    def _start(self, slot: int) -> Actor:
        handle = self._remote.remote(
            self._payload_ref, self._init, slot, self.target, self._options.cpus_per_worker()
        )
        actor = Actor(handle, slot, handle.prepare.remote())
        self.actors.append(actor)
        return actor

    def poll(self, lost: tuple[type[BaseException], ...]) -> list[Actor]:
        """Takes in the actors that have started since the last call; returns those found
        dead meanwhile (the caller hands their tasks to others)."""
        waiting = [a for a in self.actors if not a.ready and not a.dead]
        if not waiting:
            return []
        refs = [a.prepared for a in waiting]
        done = set(self._ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        died = []
        for actor in waiting:
            if actor.prepared not in done:
                continue
            try:
                place, failure = self._ray.get(actor.prepared)
            except lost as e:
                self.lost(actor, e)
                died.append(actor)
                continue
            actor.ready, actor.place = True, place
            self._early_deaths = 0
            if failure is not None and self.failure is None:
                self.failure = failure.rebuild(f"Ray actor {actor.slot} of {self.target}")
        return died

    def choose(self) -> Actor:
        """The actor for the next chunk: a started one with the fewest results owed (the
        faster actors drain theirs first), in turn among equals; one still starting when
        none has started."""
        usable = [a for a in self.actors if a.usable]
        ready = [a for a in usable if a.ready] or usable
        turn, n = next(self._turn), len(ready)
        return ready[min(range(n), key=lambda i: (len(ready[i].tickets), (i - turn) % n))]

    def lost(self, actor: Actor, error: BaseException) -> None:
        """`actor` is gone (killed, crashed, its node removed): its slot gets a new actor,
        unless the pool has shrunk below it meanwhile."""
        if actor.dead:
            return
        actor.dead = True
        self._kill(actor)  # (a result lost with its node: the actor may still run)
        if actor in self.actors:
            self.actors.remove(actor)
        if not actor.ready:
            self._early_deaths += 1
            if self._early_deaths >= _MAX_EARLY_DEATHS:
                raise WorkerDiedError(
                    f"chute: {self._early_deaths} Ray actors in a row died before they "
                    f"started, the last ({actor.describe(self.target)}) with: {error}. "
                    "Check that the resources asked for (RayWorkers(resources_per_worker="
                    f"{dict(self._options.resources_per_worker or {'CPU': 1})})) and the "
                    "actor_options (runtime_env) can be met by the cluster's nodes.",
                    worker_index=actor.slot,
                    exitcode=None,
                ) from error
        if not actor.retiring and actor.slot < self.target:
            self._start(actor.slot)

    def resize(self, count: int) -> None:
        """`count` actors from now on: new slots get new actors; the actors of slots past
        it take no new chunk and end once their results are received."""
        self.target = count
        taken = {a.slot for a in self.actors if a.usable}
        for slot in range(count):
            if slot not in taken:
                self._start(slot)
        for actor in list(self.actors):
            if actor.slot >= count and actor.usable:
                actor.retiring = True
                self.reap(actor)

    def reap(self, actor: Actor) -> None:
        """Ends a retired actor that owes nothing any more."""
        if actor.retiring and not actor.tickets and not actor.dead:
            actor.dead = True
            self.actors.remove(actor)
            self._kill(actor)

    def _kill(self, actor: Actor) -> None:
        try:
            self._ray.kill(actor.handle, no_restart=True)
        except Exception:
            pass  # already gone

    def close(self) -> None:
        for actor in self.actors:
            actor.dead = True
            self._kill(actor)
        self.actors.clear()
