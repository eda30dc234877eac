"""InterleaveIterDataset: Grain's order, parallel reads, exact restore, any worker count."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.experimental import InterleaveIterDataset
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def _files(sizes: list[int]) -> list[chute.MapDataset[int]]:
    return [chute.MapDataset.range(100 * i, 100 * i + n) for i, n in enumerate(sizes)]


def test_order_is_grains() -> None:
    # grain 0.2.18's output for the same inputs.
    ds = InterleaveIterDataset(_files([3, 1, 0, 4, 2]), cycle_length=2)
    assert list(ds) == [0, 100, 1, 2, 300, 400, 301, 401, 302, 303]
    assert list(InterleaveIterDataset(_files([2, 2]), cycle_length=5)) == [0, 100, 1, 101]


@given(
    sizes=st.lists(st.integers(0, 7), min_size=1, max_size=8),
    cycle=st.integers(1, 5),
    chunk=st.integers(1, 4),
)
@settings(max_examples=25, deadline=None)
def test_every_element_once_and_restore_at_every_step(
    sizes: list[int], cycle: int, chunk: int
) -> None:
    inputs = [f.to_iter_dataset().filter(lambda x: x % 5 != 1) for f in _files(sizes)]
    ds = InterleaveIterDataset(inputs, cycle_length=cycle, iter_buffer_size=chunk)
    out = list(ds)
    assert sorted(out) == sorted(x for f in _files(sizes) for x in f if x % 5 != 1)
    for f in _files(sizes):
        mine = [x for x in out if x in set(f)]
        assert mine == sorted(mine)
    assert_equal_output_after_checkpoint(ds, max_elements=60)


class SlowFile:
    """A file whose every record read takes `latency` seconds (remote storage)."""

    def __init__(self, index: int, n: int, latency: float, threads: set[str]) -> None:
        self._index, self._n, self._latency, self._threads = index, n, latency, threads

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> int:
        self._threads.add(threading.current_thread().name)
        time.sleep(self._latency)
        return self._index * 1000 + i


def test_inputs_are_read_in_parallel_threads() -> None:
    threads: set[str] = set()
    no_threads = chute.ReadOptions(num_threads=0)
    files = [
        chute.MapDataset.source(SlowFile(i, 20, 0.002, threads)).to_iter_dataset(no_threads)
        for i in range(8)
    ]
    ds = InterleaveIterDataset(files, cycle_length=8, iter_buffer_size=4)
    out = list(ds)
    assert sorted(out) == sorted(i * 1000 + r for i in range(8) for r in range(20))
    assert len({t for t in threads if t.startswith("chute-interleave")}) >= 2


def test_errors_and_close() -> None:
    with pytest.raises(ValueError, match="cycle_length=0 is invalid"):
        InterleaveIterDataset(_files([1]), cycle_length=0)
    with pytest.raises(TypeError, match="datasets must be a list of IterDatasets or MapDatasets"):
        InterleaveIterDataset([[1, 2]], cycle_length=1)  # type: ignore[list-item]
    it = iter(InterleaveIterDataset(_files([5, 5]), cycle_length=2))
    it.start_prefetch()
    assert next(it) == 0
    it.close()
    it.close()
    with pytest.raises(RuntimeError, match="closed iterator"):
        list(it)


def _workers(n: int) -> chute.IterDataset[Any]:
    files = [chute.MapDataset.range(100 * i, 100 * i + 30).shuffle(seed=i) for i in range(6)]
    ds = InterleaveIterDataset(files, cycle_length=3, iter_buffer_size=4)
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=n))


def test_same_output_for_0_and_3_workers() -> None:
    assert_trees_equal(list(_workers(3)), list(_workers(0)))
    assert_equal_output_after_checkpoint(
        _workers(0), restore_into=_workers(3), max_elements=180, steps=[0, 1, 50, 97, 179, 180]
    )


class _JsonlLines(chute.DatasetIterator[dict[str, Any]]):
    """A file read line by line that closes it at the end, so a call after the end fails
    on the closed file (as a hand-written JSON Lines iterator often does)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path, self._line = path, 0
        self._file = open(path)  # noqa: SIM115 (closed at the end, as the original does)

    def __next__(self) -> dict[str, Any]:
        line = self._file.readline()
        if not line:
            self._file.close()
            raise StopIteration
        self._line += 1
        return json.loads(line)

    def get_state(self) -> dict[str, Any]:
        return {"line": self._line}

    def set_state(self, state: dict[str, Any]) -> None:
        self._file.close()
        self._file = open(self._path)  # noqa: SIM115
        for _ in range(state["line"]):
            self._file.readline()
        self._line = state["line"]


class _JsonlFile(chute.IterDataset[dict[str, Any]]):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path

    def __iter__(self) -> _JsonlLines:
        return _JsonlLines(self._path)

    def __repr__(self) -> str:
        return f"JsonlFile({self._path.name})"


@pytest.mark.parametrize("parallelism", [0, 2])
def test_an_input_that_fails_when_called_after_its_end_is_named(
    tmp_path: Path, parallelism: int
) -> None:
    paths = []
    for k in range(3):
        path = tmp_path / f"part-{k}.jsonl"
        path.write_text("".join(json.dumps({"k": k, "i": i}) + "\n" for i in range(3)))
        paths.append(path)
    ds = InterleaveIterDataset(
        [_JsonlFile(p) for p in paths], cycle_length=2, parallelism=parallelism
    )
    it = iter(ds)
    with pytest.raises(
        RuntimeError,
        match=r"input 0 of 3 \(JsonlFile\(part-0\.jsonl\)\) raised ValueError\('I/O operation "
        r"on closed file.'\) when its iterator was called again after it was exhausted .*"
        r"must raise StopIteration again on every later call",
    ) as caught:
        list(it)
    assert isinstance(caught.value.__cause__, ValueError)
    it.close()
    # An input that keeps raising StopIteration reads as before.
    good = InterleaveIterDataset(
        [chute.MapDataset.source([{"k": k, "i": i} for i in range(3)]) for k in range(3)],
        cycle_length=2,
        parallelism=parallelism,
    )
    assert [(x["k"], x["i"]) for x in good] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (2, 0), (2, 1), (2, 2)
    ]  # fmt: skip
