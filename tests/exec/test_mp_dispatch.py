"""Which worker computes a chunk: the one with the fewest tasks not yet done, so a worker
slowed down (by a core it shares) does not hold the others idle. Output and errors stay
in index order."""

from __future__ import annotations

import os
from collections import Counter

import pytest

import chute
import mp_pipelines as mpp


def test_a_faster_worker_computes_more_chunks() -> None:
    ds = chute.MapDataset.range(600).map(mpp.paced_with_pid).to_iter_dataset()
    it = iter(
        ds.mp_prefetch(
            chute.MultiprocessingOptions(num_workers=2),
            worker_init_fn=mpp.slow_first_worker,
        )
    )
    try:
        got = list(it)
    finally:
        it.close()
    assert [x for x, _ in got] == list(range(600))  # in index order all the same
    by_worker = Counter(pid for _, pid in got if pid != os.getpid()).most_common()
    (_, fast), (_, slow) = by_worker
    # 8 times as fast: ~8 times the elements, could chunks go to whichever is free. Given
    # out in turn they went 3 to 1 (chunks are sized from the latest result: the fast
    # worker's are larger).
    assert fast >= 4 * slow, by_worker


@pytest.mark.timeout(60)
def test_a_worker_dying_after_others_finished_ahead_ends_the_stream_in_order() -> None:
    ds = chute.MapDataset.range(600).map(mpp.die_at_400_in_a_worker).to_iter_dataset()
    options = chute.MultiprocessingOptions(num_workers=2)
    it = iter(ds.mp_prefetch(options, worker_init_fn=mpp.in_worker))
    got: list[int] = []
    with pytest.raises(chute.multiprocessing.WorkerDiedError, match="exited with code 3"):
        for x in it:
            got.append(x)
    it.close()
    # Every element before the dead worker's chunk, in order: results other workers had
    # ready, received ahead, wait their turn behind the failure as before.
    assert got == list(range(len(got))) and 0 < len(got) <= 400
