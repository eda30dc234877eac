"""Worker functions for the tests of `chute._src.exec.mp`, importable by worker processes.

Tests put this directory on `sys.path`, which multiprocessing hands to its children.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

_INIT_CALLS: list[tuple[int, int]] = []


class Pair(NamedTuple):
    left: Any
    right: Any


@dataclass
class Example:
    image: np.ndarray
    label: int
    extra: dict[str, Any]


def identity(index: int, count: int, task: Any) -> Any:
    return task


def whoami(index: int, count: int, task: Any) -> tuple[int, int, Any, int]:
    return index, count, task, os.getpid()


def square_block(index: int, count: int, task: int) -> np.ndarray:
    """Task k -> the array k * 1000 + arange(2000), as a deterministic function of k."""
    return np.arange(2000, dtype=np.int64) + task * 1000


def filled(index: int, count: int, task: tuple[float, int]) -> np.ndarray:
    """(value, nbytes) -> a float64 array of nbytes // 8 copies of value."""
    value, nbytes = task
    return np.full(nbytes // 8, value, dtype=np.float64)


def tree(index: int, count: int, task: int) -> dict[str, Any]:
    rng = np.random.default_rng(task)
    return {
        "big": rng.standard_normal((64, 64)),
        "fortran": np.asfortranarray(rng.standard_normal((32, 48))),
        "strided": rng.standard_normal((40, 40))[:, ::2],
        "small": np.arange(3, dtype=np.int16),
        "objects": np.array(["a", None, 3], dtype=object),
        "empty": np.zeros((0, 5)),
        "scalar": np.float32(task),
        "list": [np.full(500, task, dtype=np.int32), "text", b"bytes", 7],
        "pair": Pair(np.ones(1000, dtype=np.uint8), (1, 2.5)),
        "example": Example(np.zeros((32, 32, 3), dtype=np.uint8) + task, task, {"k": [1, 2]}),
    }


def record_init(index: int, count: int) -> None:
    _INIT_CALLS.append((index, count))


def init_calls(index: int, count: int, task: Any) -> list[tuple[int, int]]:
    return list(_INIT_CALLS)


def failing_init(index: int, count: int) -> None:
    if index == 1:
        raise RuntimeError(f"cannot initialise worker {index}")


class CustomError(Exception):
    pass


class UnpicklableError(Exception):
    def __init__(self, a: int, b: int) -> None:  # pickle re-creates it with one argument
        super().__init__(f"{a}/{b}")


def fail_on(index: int, count: int, task: int) -> int:
    if task == 3:
        raise CustomError(f"bad task {task}")
    return task


def fail_unpicklable(index: int, count: int, task: int) -> int:
    raise UnpicklableError(task, 0)


def return_lambda(index: int, count: int, task: int) -> Any:
    return lambda: task


def die(index: int, count: int, task: int) -> int:
    if task == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return task


def sleep(index: int, count: int, seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def limit_file_size(index: int, count: int) -> None:
    """Makes every later posix_fallocate beyond 1 MiB fail in this worker (EFBIG)."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))


def mmapped_blocks_holding(index: int, count: int, nbytes: int) -> int:
    """How many more blocks glibc maps on their own while `nbytes` are held."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )]  # fmt: skip

    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = MallInfo2
    before = int(mallinfo2().hblks)
    held = np.ones(nbytes, dtype=np.uint8)
    blocks = int(mallinfo2().hblks) - before
    del held
    return blocks
