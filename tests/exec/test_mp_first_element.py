"""The consumer computes an iterator's first element itself while its workers start; the
workers are given the elements after it as soon as they are started, not when it is
done (they were idle until then: ~0.1 s for a batch of images)."""

from __future__ import annotations

import os

import pytest

import chute
from mp_pipelines import double, fail_first, stamp_slow_first

OPTIONS = chute.MultiprocessingOptions(num_workers=2)


@pytest.fixture(scope="module", autouse=True)
def forkserver_running() -> None:
    """A pool has run in this process: the forkserver is up, so workers start in
    ~0.02 s, well within the first element's second."""
    ds = chute.MapDataset.range(4).map(double).to_iter_dataset().mp_prefetch(OPTIONS)
    assert list(ds) == [0, 2, 4, 6]


def test_workers_compute_the_elements_after_the_first_while_it_is_computed() -> None:
    ds = chute.MapDataset.range(16).map(stamp_slow_first).to_iter_dataset().mp_prefetch(OPTIONS)
    it = iter(ds)
    got = [next(it) for _ in range(4)]
    it.close()
    assert [x for x, *_ in got] == [0, 1, 2, 3]
    first, *rest = got
    assert first[1] == os.getpid()  # the consumer's process computed it
    for x, pid, began, _ in rest:
        assert pid != os.getpid(), x
        assert began < first[3], (x, began - first[3])  # before the first was done


def test_a_first_element_that_fails_raises_as_in_place() -> None:
    ds = chute.MapDataset.range(16).map(fail_first).to_iter_dataset().mp_prefetch(OPTIONS)
    it = iter(ds)
    with pytest.raises(KeyError, match="element 0 is bad") as info:
        next(it)
    it.close()
    # Raised from the element's own frame, noted as in one process (no worker named).
    assert "fail_first" in "".join(str(f) for f in info.traceback)
    notes = getattr(info.value, "__notes__", [])
    assert any("at element index 0" in n for n in notes), notes
    assert not any("worker" in n for n in notes), notes
