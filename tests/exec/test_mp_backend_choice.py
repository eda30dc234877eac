"""The options object given to `mp_prefetch` starts its workers (`start_service`): a new
kind of workers is one more options class, with no edit in the stage. Real worker
processes; the subclass records what it was asked to start."""

from __future__ import annotations

import dataclasses
from typing import Any

import chute


@dataclasses.dataclass(frozen=True)
class RecordedWorkers(chute.MultiprocessingOptions):
    """Worker processes, as `MultiprocessingOptions` starts them, each start recorded."""

    started: list[tuple[int, int, int]] = dataclasses.field(default_factory=list)

    def start_service(self, leaves: Any, streams: Any, worker_init_fn: Any, pipeline: Any) -> Any:
        service = super().start_service(leaves, streams, worker_init_fn, pipeline)
        self.started.append((len(leaves), len(streams), service.workers))
        return service


def _double(x: int) -> int:
    return 2 * x


def test_the_options_object_starts_the_workers() -> None:
    options = RecordedWorkers(num_workers=2)
    ds = chute.MapDataset.range(50).map(_double).to_iter_dataset().batch(5)
    it = iter(ds.mp_prefetch(options))
    assert [list(b) for b in it] == [[2 * i for i in range(j, j + 5)] for j in range(0, 50, 5)]
    it.close()
    assert options.started == [(1, 0, 2)]  # one leaf, no stream of shards, two workers


def test_no_workers_start_nothing() -> None:
    options = RecordedWorkers(num_workers=0)
    ds = chute.MapDataset.range(10).to_iter_dataset().mp_prefetch(options)
    assert list(ds) == list(range(10))
    assert options.started == []
