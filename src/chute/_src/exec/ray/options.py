"""`RayWorkers`: `mp_prefetch`'s workers as Ray actors. This module imports no Ray (the
service, `start_service`, imports it when the workers start), so the options can be
built and checked without the extra installed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from chute._src.core.options import MultiprocessingOptions
from chute._src.core.tuning import AUTOTUNE, Autotune

if TYPE_CHECKING:
    from chute._src.core.dataset import IterDataset, MapDataset
    from chute._src.exec.workers.backend import ChunkBackend
    from chute._src.exec.workers.shards import ShardStream

_RESOURCE_NAMES = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}
_OWN_ACTOR_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "lifetime", "max_restarts")


@dataclasses.dataclass(frozen=True)
class RayWorkers(MultiprocessingOptions):
    """`mp_prefetch`'s workers as actors of a Ray cluster; accepted wherever
    `MultiprocessingOptions` are (`ds.mp_prefetch(RayWorkers(8))`, `DataLoader`'s
    `multiprocessing_options`, `ElasticIterator`). The output and the states are those of
    the same pipeline with no workers (docs/ray.md).

    num_workers: actors computing chunks of elements (>= 1). `chute.AUTOTUNE` (the
      default): as many as the cluster's CPUs hold at `resources_per_worker`, counted when
      the iterator is made. `chute.ray.resize(iterator, n)` changes it while iterating.
    address: the cluster to connect to when this process has not called `ray.init` yet
      (`"auto"`: the one `ray start` made on this machine, or `RAY_ADDRESS`; None: Ray's
      default, which starts a local cluster when there is none). Once connected, it is not
      looked at.
    resources_per_worker: what each actor reserves: `{"CPU": 1}` by default; `"GPU"`,
      `"memory"` (bytes) and custom resources (`{"CPU": 1, "preprocess": 1}`) too.
    max_chunks_in_flight: chunks asked of the actors and not yet consumed, per
      `to_iter_dataset` reader: what bounds the memory results take on the consumer's side.
      None: `num_workers * per_worker_buffer_size` (following `resize`).
    chunk_s: about how many seconds of an actor's work a chunk holds (worker processes:
      0.05). Each chunk costs the consumer's process ~1 ms of CPU (a task sent, a result
      fetched): larger chunks let one consumer take in more actors, smaller ones start
      faster and hold less memory in flight. Chunks never exceed 4 MiB of arrays.
    max_chunk_retries: how many times a chunk is computed again after losing its actor
      (killed, its node gone) before the loss is raised as `WorkerDiedError`: a chunk that
      kills every actor computing it is reported, not retried forever.
    actor_options: other options of Ray's `Actor.options` (`runtime_env`,
      `scheduling_strategy`, `max_concurrency`...). Not `lifetime="detached"`: the actors
      end with this process's Ray job, so none outlives a trainer that is killed.

    `per_worker_buffer_size`, `stall_warning_s`, `timeout_s` and `enable_profiling` are as
    for worker processes; a stalled actor is named with its node, but its stack is not
    shown.
    """

    num_workers: int | Autotune = AUTOTUNE
    address: str | None = None
    resources_per_worker: Mapping[str, float] | None = None
    max_chunks_in_flight: int | None = None
    chunk_s: float = 0.1
    max_chunk_retries: int = 3
    actor_options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        n = self.num_workers
        if n is not AUTOTUNE and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(
                f"RayWorkers: num_workers={n!r} is invalid: it must be an int >= 1 or "
                "chute.AUTOTUNE; e.g. RayWorkers(num_workers=8). For no workers, use "
                "chute.MultiprocessingOptions(num_workers=0)."
            )
        if self.address is not None and not isinstance(self.address, str):
            raise TypeError(
                f"RayWorkers: address={self.address!r} is not a string: pass a cluster's "
                'address ("auto", "ray://head:10001", "10.0.0.1:6379"), or None.'
            )
        c = self.chunk_s
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0 < c <= 60:
            raise ValueError(
                f"RayWorkers: chunk_s={c!r} is invalid: it must be a number of seconds in "
                "(0, 60]; e.g. RayWorkers(chunk_s=0.1)."
            )
        for name in ("max_chunks_in_flight", "max_chunk_retries"):
            value = getattr(self, name)
            if value is None and name == "max_chunks_in_flight":
                continue
            low = 1 if name == "max_chunks_in_flight" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"RayWorkers: {name}={value!r} is invalid: it must be an int >= {low}"
                    + (" or None" if name == "max_chunks_in_flight" else "")
                    + f"; e.g. RayWorkers({name}=8)."
                )
        self.actor_resources()  # checks resources_per_worker
        options = dict(self.actor_options or {})
        clash = sorted(k for k in options if k in _OWN_ACTOR_OPTIONS)
        if clash:
            raise ValueError(
                f"RayWorkers: actor_options sets {clash}, which RayWorkers decides: give "
                "resources with resources_per_worker={'CPU': 1, ...}; actors are never "
                "detached (they end with this process's Ray job) and a lost actor is "
                "replaced by chute, not restarted by Ray (max_chunk_retries)."
            )

    def start_service(
        self,
        leaves: list[MapDataset[Any]],
        streams: list[ShardStream],
        worker_init_fn: Callable[[int, int], None] | None,
        pipeline: IterDataset[Any],
    ) -> ChunkBackend:
        """The actors computing `leaves` and `streams`, and the service feeding them
        (`MultiprocessingOptions.start_service`)."""
        from chute._src.exec.ray.service import RayService

        return RayService(leaves, streams, self, worker_init_fn)

    def cpus_per_worker(self) -> float:
        return float((self.resources_per_worker or {"CPU": 1}).get("CPU", 0))

    def actor_resources(self) -> dict[str, Any]:
        """`resources_per_worker` as the keyword arguments of Ray's `Actor.options`."""
        given = dict(self.resources_per_worker) if self.resources_per_worker is not None else None
        if given is None:
            given = {"CPU": 1}
        out: dict[str, Any] = {"num_cpus": 0}
        custom: dict[str, float] = {}
        for name, amount in given.items():
            if (
                not isinstance(name, str)
                or isinstance(amount, bool)
                or not isinstance(amount, int | float)
                or amount < 0
            ):
                raise ValueError(
                    f"RayWorkers: resources_per_worker has {name!r}: {amount!r}, which is "
                    "not a resource name with an amount >= 0; e.g. "
                    "resources_per_worker={'CPU': 1, 'memory': 2 << 30}."
                )
            if name in _RESOURCE_NAMES:
                out[_RESOURCE_NAMES[name]] = amount
            else:
                custom[name] = amount
        if custom:
            out["resources"] = custom
        return out
