"""Worker hardening: nothing lost before an error, unpicklable elements named, stalled
workers shown and bounded, one iterator per thread, a missing `__main__` guard explained.

Real worker processes, real threads and real scripts throughout.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import chute
import mp_pipelines as mpp
from chute.multiprocessing import WorkerStallWarning, WorkerTimeoutError
from chute.testing import assert_trees_equal

WORKER_COUNTS = [0, 1, 2, 3]


def worker_pids() -> set[int]:
    """This process's chute workers: descendants less multiprocessing's own helpers (the
    forkserver and the resource tracker live as long as this process)."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "forkserver" in cmdline or "resource_tracker" in cmdline:
            continue
        out.add(p.pid)
    return out


def wait_until(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture
def nothing_left() -> Iterator[None]:
    """The test leaves no worker process and no thread behind."""
    before_pids, before_threads = worker_pids(), threading.active_count()
    yield
    assert wait_until(lambda: not (worker_pids() - before_pids)), worker_pids() - before_pids
    assert wait_until(lambda: threading.active_count() <= before_threads)


def workers(ds: chute.IterDataset[Any], n: int, **options: Any) -> chute.IterDataset[Any]:
    if n == 0 and not options:
        return ds
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=n, **options))


def until_error(iterable: Any) -> tuple[list[Any], BaseException | None]:
    """Every element `iterable` delivers, and the exception that ends it (None: the end)."""
    got: list[Any] = []
    it = iter(iterable)
    try:
        for x in it:
            got.append(x)
    except Exception as e:
        return got, e
    finally:
        it.close()
    return got, None


# -- 1. every element before a failing one, for any worker count --------------------------

PIPELINES: dict[str, Callable[[], chute.IterDataset[Any]]] = {
    "MapDataset.map": lambda: chute.MapDataset.range(200).map(mpp.fail_at_37).to_iter_dataset(),
    "MapDataset.filter": lambda: (
        chute.MapDataset.range(200).filter(mpp.keep_or_fail_at_37).to_iter_dataset()
    ),
    "IterDataset.map (moved into workers)": lambda: (
        chute.MapDataset.range(200).to_iter_dataset().map(mpp.fail_at_37)
    ),
    "IterDataset.filter (moved into workers)": lambda: (
        chute.MapDataset.range(200).to_iter_dataset().filter(mpp.keep_or_fail_at_37)
    ),
    "MapDataset.batch": lambda: (
        chute.MapDataset.range(200).map(mpp.fail_at_37).batch(4).to_iter_dataset()
    ),
    "shuffled, batched in the main process": lambda: (
        chute.MapDataset.range(200).shuffle(seed=3).map(mpp.fail_at_37).to_iter_dataset().batch(3)
    ),
}
EXPECTED_BEFORE_FAILURE = {
    "MapDataset.map": list(range(37)),
    "MapDataset.filter": [x for x in range(37) if x % 5],
    "IterDataset.map (moved into workers)": list(range(37)),
    "IterDataset.filter (moved into workers)": [x for x in range(37) if x % 5],
    "MapDataset.batch": [[4 * b + j for j in range(4)] for b in range(9)],
}


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_every_element_before_a_failing_one_arrives_for_any_worker_count(
    pipeline: str, num_workers: int, nothing_left: None
) -> None:
    got, error = until_error(workers(PIPELINES[pipeline](), num_workers))
    reference, reference_error = until_error(PIPELINES[pipeline]())  # in this process
    assert_trees_equal(got, reference)
    if pipeline in EXPECTED_BEFORE_FAILURE:
        plain = [x.tolist() if hasattr(x, "tolist") else x for x in got]
        assert plain == EXPECTED_BEFORE_FAILURE[pipeline]
    assert isinstance(error, ValueError) and isinstance(reference_error, ValueError)
    assert str(error) == str(reference_error)
    assert str(error) in ("cannot handle 37", "cannot judge 37")  # the user's own message
    index = 37
    if pipeline.startswith("shuffled"):  # the failing value sits elsewhere in the order
        index = list(chute.MapDataset.range(200).shuffle(seed=3)).index(37)
    notes = "\n".join(error.__notes__)
    assert f"at element index {index}\n" in notes + "\n", notes
    if num_workers:
        assert re.search(rf"raised in worker \d of {num_workers}$", notes), notes
        # The worker's traceback text, down to the user's function.
        assert re.search(r"in (keep_or_)?fail_at_37\n", str(error.__cause__)), error.__cause__


@pytest.mark.parametrize("num_workers", WORKER_COUNTS)
def test_dataloader_delivers_every_batch_before_a_failing_element(
    num_workers: int, nothing_left: None
) -> None:
    loader = chute.DataLoader(
        data_source=chute.sources.RangeDataSource(0, 200, 1),
        sampler=chute.SequentialSampler(200),
        operations=[mpp.FailAt37(), chute.Batch(4)],
        worker_count=num_workers,
    )
    got, error = until_error(loader)
    assert [b.tolist() for b in got] == EXPECTED_BEFORE_FAILURE["MapDataset.batch"]
    assert isinstance(error, ValueError) and str(error) == "cannot handle 37"
    assert "at element index 37" in "\n".join(error.__notes__)


# -- 2. an unpicklable result names its element ------------------------------------------


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_unpicklable_element_is_named_by_its_index(num_workers: int, nothing_left: None) -> None:
    ds = chute.MapDataset.range(100).map(mpp.lock_at_37).to_iter_dataset()
    got, error = until_error(workers(ds, num_workers))
    assert got == list(range(37))
    assert isinstance(error, TypeError) and "pickle" in str(error)
    notes = "\n".join(error.__notes__)
    assert "the element at index 37 cannot be pickled" in notes, notes
    assert "(0, " not in notes  # no chunk tuple: the element is named


# -- 3. stalled workers: a warning with the stack, and a timeout --------------------------

INDICES = re.compile(r"computing element ind(?:ex|ices) (\d+)(?: to (\d+))?")


def named_indices(message: str) -> range:
    m = INDICES.search(message)
    assert m is not None, message
    first = int(m.group(1))
    return range(first, int(m.group(2) or first) + 1)


def test_stalled_worker_gets_a_warning_with_its_stack_and_indices(nothing_left: None) -> None:
    ds = chute.MapDataset.range(20).map(mpp.hang_at_5).to_iter_dataset()
    with pytest.warns(WorkerStallWarning, match=r"worker \d of 2 \(pid \d+\)") as record:
        got = list(workers(ds, 2, stall_warning_s=1))
    assert got == list(range(20))  # the worker was slow, not stuck: everything arrives
    message = str(record[0].message)
    assert 5 in named_indices(message)
    assert "Its Python stack, most recent call first:" in message
    assert "in hang_at_5" in message  # the frame it is sleeping in
    assert "stall_warning_s" in message  # and how to silence it


def test_a_stack_dump_paused_between_threads_is_read_whole() -> None:
    """A worker writes its dump thread by thread, the interrupted (main) thread last; a
    busy machine can pause it between two threads for longer than the quiet time that
    ends a read (seen in CI: the warning held the receiving thread's stack only)."""
    import os
    from types import SimpleNamespace

    from chute._src.exec.mp.pool import _Worker

    read, write = os.pipe()
    os.set_blocking(read, False)
    first = b'Thread 0x1 (most recent call first):\n  File "x.py", line 1 in poll\n\n'
    last = b'Current thread 0x2 (most recent call first):\n  File "m.py", line 5 in hang\n'

    def dump() -> None:
        os.write(write, first)
        time.sleep(0.5)  # longer than the quiet time of 0.1 s
        os.write(write, last)

    writer = threading.Thread(target=dump)
    writer.start()
    try:
        reader: Any = SimpleNamespace(stack_fd=read, stack_ready=True)  # what it reads
        got = _Worker.read_stack_pipe(reader, 2.0, 0.1, b"Current thread")
    finally:
        writer.join()
        os.close(read)
        os.close(write)
    assert got == first + last


@pytest.mark.parametrize("api", ["mp_prefetch", "DataLoader"])
def test_worker_that_hangs_times_out_with_a_clear_error(api: str, nothing_left: None) -> None:
    # Workers from a running forkserver: while a program's first pool waits for it, a
    # helper thread computes elements, and one that hangs keeps that thread until it
    # returns (test_mp_cold_start covers that case with an element that does return).
    list(workers(chute.MapDataset.range(2).to_iter_dataset(), 2))
    if api == "mp_prefetch":
        ds = chute.MapDataset.range(20).map(mpp.hang_forever_at_5).to_iter_dataset()
        iterable: Any = workers(ds, 2, stall_warning_s=1, timeout_s=3)
    else:
        iterable = chute.DataLoader(
            data_source=chute.sources.RangeDataSource(0, 20, 1),
            sampler=chute.SequentialSampler(20),
            operations=[mpp.hang_forever_at_5],
            worker_count=2,
            worker_stall_warning_s=1,
            worker_timeout_s=3,
        )
    with pytest.warns(WorkerStallWarning, match="in hang_forever_at_5"):
        got, error = until_error(iterable)
    assert got == list(range(len(got))) and len(got) <= 5
    assert isinstance(error, WorkerTimeoutError) and isinstance(error, TimeoutError)
    message = str(error)
    assert re.match(r"worker (\d) of 2 \(pid \d+\), computing element ind", message), message
    assert 5 in named_indices(message)
    assert "timeout_s=3" in message and "larger timeout_s" in message
    assert "in hang_forever_at_5" in message  # the stack
    assert error.worker_index in (0, 1)


def test_stall_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"timeout_s=0 is invalid: .*seconds > 0, or None"):
        chute.MultiprocessingOptions(num_workers=1, timeout_s=0)
    with pytest.raises(ValueError, match=r"stall_warning_s='5' is invalid"):
        chute.MultiprocessingOptions(stall_warning_s="5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"timeout_s=-1 is invalid"):
        chute.DataLoader(
            data_source=[1, 2],
            sampler=chute.SequentialSampler(2),
            worker_count=1,
            worker_timeout_s=-1,
        )
    assert chute.MultiprocessingOptions().stall_warning_s == 300.0
    assert chute.MultiprocessingOptions().timeout_s is None


# -- 4. one iterator, several threads ----------------------------------------------------


def hammer(it: Any, threads: int = 4) -> tuple[list[Any], list[BaseException]]:
    """Calls next(it) from `threads` threads at once until the end or an error."""
    got: list[Any] = []
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run() -> None:
        start.wait()
        try:
            for x in it:
                got.append(x)
        except RuntimeError as e:
            errors.append(e)

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(120)
    return got, errors


ITERATORS: dict[str, Callable[[], Any]] = {
    "plain pipeline": lambda: iter(
        chute.MapDataset.range(400)
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
        .map(mpp.slow_double)
        .batch(2)
    ),
    "with workers": lambda: iter(
        chute.MapDataset.range(400)
        .map(mpp.slow_double)
        .to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    ),
    "DataLoader": lambda: iter(
        chute.DataLoader(
            data_source=chute.sources.RangeDataSource(0, 400, 1),
            sampler=chute.SequentialSampler(400),
            operations=[mpp.slow_double],
            worker_count=2,
        )
    ),
}


@pytest.mark.parametrize("kind", list(ITERATORS))
def test_next_from_several_threads_at_once_raises(kind: str, nothing_left: None) -> None:
    it = ITERATORS[kind]()
    try:
        got, errors = hammer(it)
    finally:
        it.close()
    assert errors, "four threads sharing one iterator were not detected"
    assert all(
        re.search(r"from two threads at once: .*one iterator per thread.*threading.Lock", str(e))
        for e in errors
    ), errors
    flat = [x for b in got for x in (b.tolist() if hasattr(b, "tolist") else [b])]
    assert len(flat) == len(set(flat))  # no element handed out twice


@pytest.mark.parametrize("kind", list(ITERATORS))
def test_threads_taking_turns_with_a_lock_get_every_element_once(
    kind: str, nothing_left: None
) -> None:
    it = ITERATORS[kind]()
    lock = threading.Lock()
    got: list[Any] = []

    def run() -> None:
        while True:
            with lock:
                try:
                    got.append(next(it))
                except StopIteration:
                    return

    pool = [threading.Thread(target=run) for _ in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(120)
    it.close()
    flat = sorted(x for b in got for x in (b.tolist() if hasattr(b, "tolist") else [b]))
    assert flat == [2 * x for x in range(400)]


def test_state_of_a_guarded_iterator_is_the_pipelines() -> None:
    ds = chute.MapDataset.range(10).to_iter_dataset().batch(3)
    it = iter(ds)
    next(it)
    state = it.get_state()
    assert state["stage"] == "batch" and state["parent"]["next_index"] == 3
    other = iter(ds)
    other.set_state(state)
    assert [b.tolist() for b in other] == [[3, 4, 5], [6, 7, 8], [9]]


# -- 5. a missing __main__ guard ---------------------------------------------------------


def test_dataloader_script_without_main_guard_just_runs(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import chute
            loader = chute.DataLoader(
                data_source=chute.sources.RangeDataSource(0, 100, 1),
                sampler=chute.SequentialSampler(100),
                operations=[chute.Batch(10)],
                worker_count=2,
            )
            for batch in loader:
                print(batch.sum())
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(45 + 100 * k) for k in range(10)]
    assert out.stderr == ""
