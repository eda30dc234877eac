"""`chute.torch.pin_memory(ds)`: batches pinned ahead of the loop in a background thread.

On a machine without CUDA nothing is pinned (a warning says so once), but the thread, its
order, its state and its errors are the same; the test marked `cuda` checks the pinning.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import numpy as np
import pytest

import chute

torch = pytest.importorskip("torch", reason="torch not installed: pip install 'chute[torch]'")
import chute.torch as ct  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:chute.torch.pin_memory:RuntimeWarning")


def features(i: int) -> dict[str, Any]:
    return {"x": np.full((3,), i, np.float32), "label": np.int64(i % 2), "name": f"e{i}"}


def pipeline(n: int = 40, fail_at: int | None = None, seen: list[str] | None = None) -> Any:
    def make(i: int) -> dict[str, Any]:
        if seen is not None:
            seen.append(threading.current_thread().name)
        if i == fail_at:
            raise ValueError(f"element {i} is broken")
        return features(i)

    return (
        chute.MapDataset.range(n)
        .shuffle(seed=3)
        .map(make)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .batch(4)
    )


def ids(batch: dict[str, Any]) -> list[int]:
    return [int(v) for v in batch["x"][:, 0]]


def pin_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "chute-prefetch"]


def wait_no_pin_threads() -> None:
    deadline = time.monotonic() + 10
    while pin_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pin_threads(), "a pinning thread outlived its iterator"


@pytest.mark.parametrize("buffer_size", [0, 1, 2, 5])
def test_batches_come_in_the_pipelines_order_as_tensors(buffer_size: int) -> None:
    expected = [ids(b) for b in pipeline()]
    with iter(ct.pin_memory(pipeline(), buffer_size=buffer_size)) as it:
        got = list(it)
    assert [ids(b) for b in got] == expected
    first = got[0]
    assert isinstance(first["x"], torch.Tensor) and first["x"].dtype == torch.float32
    assert isinstance(first["label"], torch.Tensor)
    assert list(first["name"]) == [f"e{i}" for i in ids(first)]  # strings stay as they are
    assert first["x"].is_pinned() == torch.cuda.is_available()
    wait_no_pin_threads()


def test_the_pipeline_runs_on_the_background_thread_not_the_loops() -> None:
    seen: list[str] = []
    with iter(ct.pin_memory(pipeline(seen=seen))) as it:
        list(it)
    assert set(seen) == {"chute-prefetch"}
    seen.clear()
    with iter(ct.pin_memory(pipeline(seen=seen), buffer_size=0)) as it:
        list(it)
    assert set(seen) == {threading.current_thread().name}  # 0: pinned in the loop's thread


@pytest.mark.parametrize("taken", [0, 1, 3, 7, 10])
def test_state_is_the_position_after_the_batches_the_loop_received(taken: int) -> None:
    pinned = ct.pin_memory(pipeline(), buffer_size=3)
    it = iter(pinned)
    it.start_prefetch()
    for _ in range(taken):
        next(it)
    ahead = min(3, 10 - taken)  # the thread pins batches ahead meanwhile
    deadline = time.monotonic() + 10
    while ahead and it.buffer_info()[0] < ahead and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not ahead or it.buffer_info()[0] == ahead
    state = it.get_state()
    plain = iter(pipeline())
    for _ in range(taken):
        next(plain)
    assert state == plain.get_state()  # the batches pinned ahead are not in it
    rest = [ids(b) for b in it]
    assert rest == [ids(b) for b in plain]

    again = iter(pinned)
    again.set_state(state)
    assert [ids(b) for b in again] == rest
    without = iter(pipeline())  # the state restores without pin_memory too
    without.set_state(state)
    assert [ids(b) for b in without] == rest
    for i in (it, again, plain, without):
        i.close()
    wait_no_pin_threads()


def test_an_iterator_is_wrapped_and_restored_in_place() -> None:
    expected = [ids(b) for b in pipeline()]
    it = ct.pin_memory(iter(pipeline()), buffer_size=2)
    head = [ids(next(it)) for _ in range(4)]
    state = it.get_state()
    assert head == expected[:4]
    assert [ids(next(it)) for _ in range(2)] == expected[4:6]
    it.set_state(state)  # back: the batches pinned ahead are dropped and recomputed
    assert [ids(b) for b in it] == expected[4:]
    it.close()
    wait_no_pin_threads()


def test_an_error_comes_out_at_its_batch_after_the_ones_before_it() -> None:
    order = [int(i) for i in chute.MapDataset.range(40).shuffle(seed=3)]
    bad = order[9]  # in the third batch
    it = iter(ct.pin_memory(pipeline(fail_at=bad), buffer_size=4))
    good = [ids(next(it)) for _ in range(2)]
    assert good == [order[0:4], order[4:8]]
    state = it.get_state()
    with pytest.raises(ValueError, match=f"element {bad} is broken"):
        next(it)
    assert it.get_state() == state  # still after the last batch received
    with pytest.raises(StopIteration):
        next(it)
    it.close()
    wait_no_pin_threads()


def test_close_and_garbage_collection_stop_the_thread() -> None:
    before = len(pin_threads())
    it = iter(ct.pin_memory(pipeline(n=400), buffer_size=2))
    next(it)
    assert len(pin_threads()) == before + 1
    it.close()
    it.close()  # idempotent
    wait_no_pin_threads()

    it = iter(ct.pin_memory(pipeline(n=400), buffer_size=2))
    next(it)
    assert pin_threads()
    del it  # dropped mid-stream without close()
    gc.collect()
    wait_no_pin_threads()


def test_batches_from_worker_processes_are_pinned_on_the_thread() -> None:
    ds = (
        chute.MapDataset.range(48)
        .map(features)
        .batch(4)
        .to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    )
    with iter(ct.pin_memory(ds)) as it:
        head = [ids(next(it)) for _ in range(3)]
        state = it.get_state()
        rest = [ids(b) for b in it]
    assert head == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert rest == [list(range(i, i + 4)) for i in range(12, 48, 4)]
    with iter(ct.pin_memory(ds)) as again:
        again.set_state(state)
        assert [ids(b) for b in again] == rest
    wait_no_pin_threads()


def test_one_batch_is_still_pinned_at_once() -> None:
    out = ct.pin_memory({"x": np.arange(3), "n": [np.float32(1.5)]})
    assert out["x"].tolist() == [0, 1, 2] and float(out["n"][0]) == 1.5
    assert out["x"].is_pinned() == torch.cuda.is_available()


@pytest.mark.parametrize("size", [-1, True, 1.5, "2"])
def test_a_bad_buffer_size_is_refused(size: Any) -> None:
    with pytest.raises(
        ValueError, match=rf"buffer_size={size!r} is invalid: it must be an int >= 0"
    ):
        ct.pin_memory(pipeline(), buffer_size=size)


def test_a_map_dataset_or_a_buffer_size_for_one_batch_is_refused() -> None:
    with pytest.raises(TypeError, match=r"is a MapDataset: call \.to_iter_dataset\(\) first"):
        ct.pin_memory(chute.MapDataset.range(4))
    with pytest.raises(TypeError, match="buffer_size=2 applies to a dataset or iterator"):
        ct.pin_memory({"x": np.arange(3)}, buffer_size=2)  # type: ignore[call-overload]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs a CUDA device")
def test_with_cuda_batches_are_pinned_and_copy_without_blocking() -> None:
    with iter(ct.pin_memory(pipeline())) as it:
        for batch in it:
            assert batch["x"].is_pinned() and batch["label"].is_pinned()
            on_gpu = batch["x"].to("cuda", non_blocking=True)
            assert on_gpu[:, 0].tolist() == ids(batch)
