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
    `ChunkResult`)."""

    failure: RemoteFailure


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

    def prepare(self) -> tuple[ActorPlace, ActorFailure | None]:
        """Runs `worker_init_fn` and unpickles the pipeline (importing its modules), before
        any task; answers where the actor runs, and what failed if something did."""
        import ray

        context = ray.get_runtime_context()
        place = ActorPlace(os.getpid(), ray.util.get_node_ip_address(), context.get_node_id())
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
            return place, ActorFailure(RemoteFailure.capture(e))
        return place, None

    def run(self, task: Task, check_pickle: bool) -> ChunkResult | ShardResult | ActorFailure:
        """`task`'s result. With `check_pickle` (asked again after Ray could not send the
        result), the elements before the first that cannot be pickled, and an error naming
        that element's index (`ChunkWorker.not_picklable`)."""
        try:
            result: ChunkResult | ShardResult = self._worker(self._slot, self._count, task)
        except BaseException as e:
            return ActorFailure(RemoteFailure.capture(e))
        if check_pickle:
            try:
                pickle.dumps(result, protocol=5, buffer_callback=_out_of_band)
            except Exception as e:
                try:
                    checked: Any = self._worker.not_picklable(task, result, e)
                except BaseException as again:
                    return ActorFailure(RemoteFailure.capture(again))
                return checked
        return result

    def __repr__(self) -> str:
        return f"chute Ray worker {self._slot} of {self._count}"
