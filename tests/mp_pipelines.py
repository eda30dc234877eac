"""Module-level functions for the worker-process tests (picklable by the standard pickle)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

import chute


def double(x: int) -> int:
    return x * 2


def keep(x: int) -> bool:
    return x % 3 != 0


def jitter(x: int, rng: np.random.Generator) -> int:
    return x * 100 + int(rng.integers(0, 100))


def big_array(i: int) -> dict[str, Any]:
    return {"image": np.full((64, 1024), i, dtype=np.float32), "label": i}


def scale_image(batch: dict[str, Any]) -> dict[str, Any]:
    """Keeps a batch built in shared memory as it is, or replaces it: alternately."""
    if batch["label"][0] % 8:
        return batch
    return {"image": batch["image"] + 0.5, "label": batch["label"]}


def fail_at_13(x: int) -> int:
    if x == 13:
        raise ValueError(f"cannot handle {x}")
    return x


def as_list(ds: chute.IterDataset[Any]) -> list[Any]:
    """Every element of `ds`, its iterator closed after (its workers stopped)."""
    it = iter(ds)
    try:
        return list(it)
    finally:
        it.close()


def rich_pipeline(workers: int, n: int = 400) -> chute.IterDataset[Any]:
    """Filter, random_map, batch and an iter-side filter before the worker boundary."""
    ds = (
        chute.MapDataset.range(n)
        .shuffle(seed=1)
        .map(double)
        .filter(keep)
        .random_map(jitter, seed=7)
        .to_iter_dataset()
        .filter(lambda_free_odd)
        .batch(5)
        .map(batch_sum)
    )
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))


def lambda_free_odd(x: int) -> bool:
    return x % 2 == 1


def batch_sum(b: np.ndarray) -> tuple[int, list[int]]:
    return int(b.sum()), b.tolist()


class WriteMarker:
    """A worker_init_fn that leaves a file per worker."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, index: int, count: int) -> None:
        (self.directory / f"worker-{index}-of-{count}-pid-{os.getpid()}").touch()


class HoldsALock:
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, x: int) -> int:
        return x


class KeepTransform(chute.FilterTransform):
    def filter(self, element: int) -> bool:
        return element % 3 != 0


def keep_transform() -> KeepTransform:
    return KeepTransform()


def first(x: tuple[int, str]) -> int:
    return x[0]


# -- for test_worker_hardening.py -------------------------------------------------------

FAILING = 37


def fail_at_37(x: int) -> int:
    if x == FAILING:
        raise ValueError(f"cannot handle {x}")
    return x


def keep_or_fail_at_37(x: int) -> bool:
    if x == FAILING:
        raise ValueError(f"cannot judge {x}")
    return x % 5 != 0


class FailAt37(chute.MapTransform):
    def map(self, element: int) -> int:
        return fail_at_37(element)


def lock_at_37(x: int) -> Any:
    """A value that cannot be pickled at element 37."""
    return threading.Lock() if x == FAILING else x


def hang_at_5(x: int) -> int:
    """Sleeps for 3 s at element 5: long enough to be warned about after 1 s."""
    if x == 5:
        time.sleep(3.0)
    return x


def hang_forever_at_5(x: int) -> int:
    if x == 5:
        time.sleep(600)
    return x


def slow_double(x: int) -> int:
    """Sleeps 2 ms (releasing the GIL), so that a `next` lasts long enough to overlap."""
    time.sleep(0.002)
    return x * 2


def with_pid(x: Any) -> tuple[Any, int]:
    """The element and the process that computed it."""
    return x, os.getpid()


def stamp_slow_first(x: int) -> tuple[int, int, float, float]:
    """(x, the process, when it began, when it ended); element 0 takes a second."""
    began = time.time()
    if x == 0:
        time.sleep(1.0)
    return x, os.getpid(), began, time.time()


def fail_first(x: int) -> int:
    if x == 0:
        time.sleep(0.3)  # the workers start meanwhile
        raise KeyError("element 0 is bad")
    return x


class Pair(NamedTuple):
    left: Any
    right: Any


def uniform(i: int) -> dict[str, Any]:
    """Element `i`: one structure of same-shaped arrays for every `i` (sent as columns)."""
    return {
        "ids": np.full(128, i, np.int32),
        "pair": Pair(np.arange(3, dtype=np.float32) + i, np.asarray(i)),  # a 0-d leaf
        "list": [np.zeros((2, 2), np.uint8) + i % 256],
    }


def ragged_after_100(i: int) -> dict[str, Any]:
    """Uniform up to 100, then rows of 1 to 3 tokens: chunks of both kinds."""
    return uniform(i) if i < 100 else {"ids": np.full(1 + i % 3, i, np.int32)}


def assert_exactly_equal(x: Any, y: Any, where: str = "element") -> None:
    """Equal structures of the same types (a 0-d array is not a scalar), and arrays of the
    same shape, dtype and values."""
    assert type(x) is type(y), f"{where}: {type(x)} is not {type(y)}"
    if isinstance(x, dict):
        assert list(x) == list(y), f"{where}: keys {list(x)} != {list(y)}"
        for k in x:
            assert_exactly_equal(x[k], y[k], f"{where}[{k!r}]")
    elif isinstance(x, list | tuple):
        assert len(x) == len(y), where
        for k, (a, b) in enumerate(zip(x, y)):
            assert_exactly_equal(a, b, f"{where}[{k}]")
    elif isinstance(x, np.ndarray):
        assert (x.shape, x.dtype) == (y.shape, y.dtype), f"{where}: {x!r} != {y!r}"
        np.testing.assert_array_equal(x, y, err_msg=where)
    else:
        assert x == y, f"{where}: {x!r} != {y!r}"


_DELAY = [0.0]


def slow_first_worker(index: int, count: int) -> None:
    """worker_init_fn: worker 0 takes 8 times as long per element as the others."""
    _DELAY[0] = 0.004 if index == 0 else 0.0005


def paced_with_pid(x: int) -> tuple[int, int]:
    time.sleep(_DELAY[0])
    return x, os.getpid()


def in_worker(index: int, count: int) -> None:
    """worker_init_fn: marks this process as a worker."""
    _DELAY[0] = -1.0


def die_at_400_in_a_worker(x: int) -> int:
    if x == 400 and _DELAY[0] == -1.0:
        os._exit(3)  # the worker process ends, as one killed would
    return x
