"""`ds.prefetch(chute.AUTOTUNE)` and `ds.prefetch(n)` as a tf.data user means them."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import chute
from chute.experimental import ThreadPrefetchIterDataset
from chute.testing import assert_equal_output_after_checkpoint


def _batches() -> chute.IterDataset[Any]:
    return chute.MapDataset.range(40).shuffle(seed=1).to_iter_dataset().batch(4)


@pytest.mark.parametrize("buffer", [chute.AUTOTUNE, 0, 1, 5])
def test_same_elements_and_states_as_without_it(buffer: object) -> None:
    ds = _batches().prefetch(buffer)
    assert [b.tolist() for b in ds] == [b.tolist() for b in _batches()]
    assert_equal_output_after_checkpoint(ds, restore_into=_batches())
    assert_equal_output_after_checkpoint(_batches(), restore_into=ds, steps=[0, 4, 10])


def test_autotune_computes_ahead_in_a_background_thread() -> None:
    made: list[str] = []

    def record(x: int) -> int:
        made.append(threading.current_thread().name)
        return x

    ds = chute.MapDataset.range(10).to_iter_dataset().map(record).prefetch(chute.AUTOTUNE)
    assert isinstance(ds, ThreadPrefetchIterDataset)
    it = iter(ds)
    assert next(it) == 0
    deadline = time.monotonic() + 10
    while len(made) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(made) == 4  # the one handed out, 2 in the buffer, 1 waiting to go in
    assert set(made) == {"chute-prefetch"}
    it.close()


def test_options_still_mean_worker_processes() -> None:
    ds = _batches().prefetch(chute.MultiprocessingOptions(num_workers=0))
    assert [b.tolist() for b in ds] == [b.tolist() for b in _batches()]
    assert type(ds) is type(_batches().mp_prefetch(chute.MultiprocessingOptions(num_workers=0)))


@pytest.mark.parametrize("bad", [-1, 2.5, "AUTOTUNE", True, None])
def test_anything_else_names_both_stages(bad: object) -> None:
    with pytest.raises(
        TypeError, match=r"prefetch\(.*\) is invalid.*ThreadPrefetchIterDataset.*mp_prefetch"
    ):
        _batches().prefetch(bad)
