"""Readers under one `mp_prefetch`, each advanced on a thread of its own (`prefetch(n)`
branches mixed or zipped, the copies `sequential_slice=True` makes of a prefetched
pipeline, shard streams behind prefetch threads): every run gives the elements of the
same pipeline with no workers, states restore into any worker count, and nothing is left
running afterwards.

Each case runs several times: the readers' threads interleave differently every run, and
one unlucky interleaving used to be enough (results routed to another reader's ticket,
two threads reading one worker's socket, or a wait for a result another thread took).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import chute
import mp_pipelines as mpp
from chute.experimental import JsonlIterDataset, ZipIterDataset

sys.path.insert(0, str(Path(__file__).parent))
from test_mp_prefetch import wait_until, worker_pids

import shard_helpers as sh

RUNS = 10  # runs of each case: enough that a race between the readers shows
N = 240  # elements per branch

# A run that deadlocks fails here instead of holding the suite.
pytestmark = pytest.mark.timeout(120)

_THREADS = ("chute-prefetch", "chute-start-workers", "chute-startup", "chute-first-element")


def _opts(workers: int | chute.MultiprocessingOptions) -> chute.MultiprocessingOptions:
    """Options of `workers` local worker processes, or the options given (Ray's)."""
    if isinstance(workers, chute.MultiprocessingOptions):
        return workers
    return chute.MultiprocessingOptions(num_workers=workers)


def _branch(offset: int, n: int = N) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(offset, offset + n).map(mpp.double).to_iter_dataset()


def mixed(workers: int | chute.MultiprocessingOptions) -> chute.IterDataset[Any]:
    """Two branches, each behind its own prefetch thread, mixed."""
    branches = [_branch(0).prefetch(3), _branch(10_000).prefetch(3)]
    return chute.IterDataset.mix(branches, [1.0, 2.0]).mp_prefetch(_opts(workers))


def zipped(workers: int | chute.MultiprocessingOptions) -> chute.IterDataset[Any]:
    """Two branches, each behind its own prefetch thread, zipped."""
    branches = [_branch(0).prefetch(3), _branch(10_000, 3 * N).batch(3, batch_fn=list).prefetch(2)]
    return ZipIterDataset(branches).mp_prefetch(_opts(workers))


def one_prefetched(workers: int | chute.MultiprocessingOptions) -> chute.IterDataset[Any]:
    """A branch behind a prefetch thread mixed with one read on the consumer's thread."""
    branches = [_branch(0).prefetch(3), _branch(10_000)]
    return chute.IterDataset.mix(branches, [1.0, 1.0]).mp_prefetch(_opts(workers))


BUILDERS = {"mix": mixed, "zip": zipped, "one_prefetched": one_prefetched}


def _threads_left() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name in _THREADS]


def _assert_nothing_left(before: set[int]) -> None:
    assert wait_until(lambda: not (worker_pids() - before)), worker_pids() - before
    assert wait_until(lambda: not _threads_left()), _threads_left()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("case", sorted(BUILDERS))
def test_prefetched_branches_give_the_elements_of_no_workers_every_run(
    case: str, workers: int
) -> None:
    build = BUILDERS[case]
    reference = mpp.as_list(build(0))
    assert len(reference) > N // 2
    before = worker_pids()
    for run in range(RUNS):
        assert mpp.as_list(build(workers)) == reference, f"run {run}"
    _assert_nothing_left(before)


def _grain_order(n: int, shares: int) -> list[int]:
    """`sequential_slice=True`'s order, written out: `shares` contiguous shares of
    `range(n)` (the first `n % shares` one longer), taken one element at a time in turn."""
    sizes = [n // shares + (i < n % shares) for i in range(shares)]
    starts = [sum(sizes[:i]) for i in range(shares)]
    return [starts[i] + j for j in range(max(sizes)) for i in range(shares) if j < sizes[i]]


def test_sequential_slice_over_a_prefetched_pipeline_every_run() -> None:
    # With 2 workers, two copies of the pipeline, each with its own prefetch thread.
    expected = [mpp.double(i) for i in _grain_order(N + 1, 2)]
    before = worker_pids()
    for run in range(RUNS):
        ds = _branch(0, N + 1).prefetch(3).mp_prefetch(_opts(2), sequential_slice=True)
        assert mpp.as_list(ds) == expected, f"run {run}"
    _assert_nothing_left(before)


def _jsonl(tmp_path: Path, name: str, counts: list[int]) -> list[str]:
    paths = []
    for f, n in enumerate(counts):
        path = tmp_path / f"{name}-{f:02d}.jsonl"
        path.write_text("".join(json.dumps({"shard": f, "row": r}) + "\n" for r in range(n)))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("workers", [1, 2])
def test_prefetched_shard_streams_give_the_elements_of_no_workers_every_run(
    tmp_path: Path, workers: int
) -> None:
    first = _jsonl(tmp_path, "a", [40, 7, 55, 23])
    second = _jsonl(tmp_path, "b", [31, 60, 2, 18])

    def build(w: int) -> chute.IterDataset[Any]:
        branches = [
            JsonlIterDataset(paths, cycle_length=2).map(sh.key).prefetch(3)
            for paths in (first, second)
        ]
        return chute.IterDataset.mix(branches, [1.0, 1.0]).mp_prefetch(_opts(w))

    reference = mpp.as_list(build(0))
    assert len(reference) > 100
    before = worker_pids()
    for run in range(RUNS):
        assert mpp.as_list(build(workers)) == reference, f"run {run}"
    _assert_nothing_left(before)


@pytest.mark.parametrize("restored_with", [0, 1, 2])
@pytest.mark.parametrize("case", ["mix", "zip"])
def test_a_state_taken_mid_stream_restores_into_another_worker_count(
    case: str, restored_with: int
) -> None:
    build = BUILDERS[case]
    reference = mpp.as_list(build(0))
    before = worker_pids()
    for step in (0, 5, 77, len(reference) - 1):
        it = iter(build(2))
        try:
            head = [next(it) for _ in range(step)]
            state = json.loads(json.dumps(it.get_state()))
            assert head == reference[:step]
        finally:
            it.close()
        again = iter(build(restored_with))
        try:
            again.set_state(state)
            assert list(again) == reference[step:], f"restored at step {step}"
        finally:
            again.close()
    _assert_nothing_left(before)
