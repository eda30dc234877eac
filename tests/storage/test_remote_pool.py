"""The remote thread pool runs a burst of blocking work at once (a dataset opens its
objects together), even when an idle thread is left from earlier work."""

from __future__ import annotations

import threading

from chute._src.storage.remote import pool


def test_a_burst_of_work_runs_at_once_after_idle_threads_are_left() -> None:
    pool.submit(lambda: None).result(timeout=30)  # leaves an idle thread behind
    barrier = threading.Barrier(8, timeout=30)  # breaks unless all 8 run together

    def meet() -> int:
        return barrier.wait()

    futures = [pool.submit(meet) for _ in range(8)]
    assert sorted(f.result(timeout=60) for f in futures) == list(range(8))
