"""What chute reads of the machine, and that reading it leaves nothing open."""

from __future__ import annotations

import gc
import os
import threading

import pytest

import chute
from chute._src.core import machine


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux only")
def test_thread_times_close_their_file_when_the_thread_ends() -> None:
    machine.thread_times_ns()  # this thread's file, and libc, loaded once
    before = _fds()

    def measure() -> None:
        on_cpu, queued = machine.thread_times_ns()
        assert on_cpu > 0 and queued >= 0

    for _ in range(50):
        t = threading.Thread(target=measure)
        t.start()
        t.join()
    gc.collect()
    assert _fds() - before == set()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts fds in /proc")
def test_pipelines_measured_in_threads_leave_no_file_open() -> None:
    """Debug mode measures each stage on the thread that runs it: a run's threads end,
    and so do their files."""
    ds = chute.MapDataset.range(200).map(lambda x: x + 1).to_iter_dataset().prefetch(4)
    chute.config.update("py_debug_mode", True)
    try:
        list(ds)  # imports and pools warmed
        gc.collect()
        before = _fds()
        for _ in range(10):
            it = iter(ds)
            assert sum(it) == sum(range(1, 201))
            it.close()
        gc.collect()
    finally:
        chute.config.update("py_debug_mode", False)
    assert len(_fds() - before) <= 2  # a pool's wake-up pipe may open; not one per run
