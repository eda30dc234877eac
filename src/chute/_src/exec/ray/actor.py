"""The Ray actor each `RayWorkers` worker is: `workers.worker.ChunkWorker` run as it is, on
the payload `mp_prefetch` pickles for worker processes (`pipeline_pickle.dumps`).

A result travels back through Ray's object store: its numpy arrays are stored once and
reach the consumer as read-only views of the store, with no copy. An exception raised by
chute's own code in the actor (the pipeline cannot be unpickled there: a module missing
on that node) comes back as an `ActorFailure`, not as a Ray error, so it is raised with
its traceback, as a worker process's would be.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from typing import Any

from chute._src.core import process
from chute._src.exec.mp.transport import RemoteFailure
from chute._src.exec.workers.tasks import ChunkResult, ShardResult, Task
from chute._src.exec.workers.worker import ChunkWorker, ShippedInit


@dataclasses.dataclass(frozen=True, slots=True)
class ActorFailure:
    """chute's code raised in the actor (not an element's stage: those come back in a
    `ChunkResult`), which runs at `place`."""

    failure: RemoteFailure
    place: ActorPlace

    def rebuild(self, who: str) -> BaseException:
        """The exception again, with notes naming the actor (`who`) and the likely fix."""
        exc = self.failure.rebuild()
        exc.add_note(
            f"chute: raised in {who} ({self.place}) preparing or running a task: "
            "worker_init_fn, or unpickling the pipeline (a module it needs must be "
            "importable on every node of the cluster, e.g. "
            "RayWorkers(actor_options={'runtime_env': {'py_modules': [module]}}))"
        )
        return exc


@dataclasses.dataclass(frozen=True, slots=True)
class ActorPlace:
    """Where an actor runs, for messages: its process and its node."""

    pid: int
    node_ip: str
    node_id: str

    def __str__(self) -> str:
        return f"pid {self.pid} on node {self.node_ip} ({self.node_id[:12]})"


def _out_of_band(_: pickle.PickleBuffer) -> bool:
    return False  # array data is not copied when checking that a result pickles


class ChunkActor:
    """One worker: computes the tasks the consumer's `RayService` sends it, in order."""

    def __init__(
        self, payload: bytes, init: ShippedInit | None, slot: int, count: int, cpus: float
    ) -> None:
        self._worker = ChunkWorker(payload)
        self._init = init
        self._slot = slot
        self._count = count
        self._cpus = cpus  # each actor's, to count how many of them this node holds
        self._place = ActorPlace(os.getpid(), "", "")

    def prepare(self) -> tuple[ActorPlace, ActorFailure | None]:
        """Runs `worker_init_fn` and unpickles the pipeline (importing its modules), before
        any task; answers where the actor runs, and what failed if something did."""
        import ray

        context = ray.get_runtime_context()
        place = ActorPlace(os.getpid(), ray.util.get_node_ip_address(), context.get_node_id())
        self._place = place
        try:
            # What sizes a resource per process (the remote block cache) reads: the actors
            # of this pipeline this node can hold, at most all of them.
            node_cpus = next(
                (n["Resources"].get("CPU", 1) for n in ray.nodes() if n["NodeID"] == place.node_id),
                1,
            )
            here = int(node_cpus // self._cpus) if self._cpus > 0 else self._count
            process.set_worker_count(max(1, min(self._count, here)))
            if self._init is not None:
                self._init(self._slot, self._count)
            self._worker._load()
        except BaseException as e:
            return place, ActorFailure(RemoteFailure.capture(e), place)
        return place, None

    def run(self, task: Task, check_pickle: bool) -> ChunkResult | ShardResult | ActorFailure:
        """`task`'s result. With `check_pickle` (asked again after Ray could not send the
        result), the elements before the first that cannot be pickled, and an error naming
        that element's index (`ChunkWorker.not_picklable`)."""
        try:
            result: ChunkResult | ShardResult = self._worker(self._slot, self._count, task)
        except BaseException as e:
            return ActorFailure(RemoteFailure.capture(e), self._place)
        if check_pickle:
            try:
                pickle.dumps(result, protocol=5, buffer_callback=_out_of_band)
            except Exception as e:
                try:
                    checked: Any = self._worker.not_picklable(task, result, e)
                except BaseException as again:
                    return ActorFailure(RemoteFailure.capture(again), self._place)
                return checked
        return result

    def __repr__(self) -> str:
        return f"chute Ray worker {self._slot} of {self._count}"
