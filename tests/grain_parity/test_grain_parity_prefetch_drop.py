"""Dropping a prefetching iterator whose thread is still looking for an element (a filter
that drops everything) returns at once, as in Grain; the thread stops on its own after
the element it is computing (here: once the 200,000 positions are read)."""

import gc
import time

import pytest

import chute
from chute.experimental import ThreadPrefetchIterDataset, multithread_prefetch


def _nothing_ever() -> chute.IterDataset[int]:
    return chute.MapDataset.range(200_000).filter(lambda x: x < 0).to_iter_dataset()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sleep_s", [0, 0.5])
def test_drop_after_start_prefetch(sleep_s: float) -> None:
    for ds in (
        multithread_prefetch(_nothing_ever(), num_threads=1, buffer_size=1),
        ThreadPrefetchIterDataset(_nothing_ever(), prefetch_buffer_size=1),
    ):
        it = iter(ds)
        it.start_prefetch()
        time.sleep(sleep_s)
        t0 = time.monotonic()
        del it
        gc.collect()
        # Before, the drop joined the thread, which ran until the filter found an element
        # (here: never); a loaded machine may still take a moment to collect.
        assert time.monotonic() - t0 < 5


def test_close_still_waits_for_the_thread() -> None:
    ds = ThreadPrefetchIterDataset(
        chute.MapDataset.range(100).to_iter_dataset(), prefetch_buffer_size=4
    )
    it = iter(ds)
    assert next(it) == 0
    it.close()
    assert list(it) == []
