"""mp_prefetch and DataLoader(worker_count=N): same output for any worker count, exact
restore across worker counts, zero-copy arrays, errors and leak-free shutdown."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
import mp_pipelines as mpp
import shm_helpers
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0]


def descendants(root: int) -> set[int]:
    """Live (non-zombie) processes below `root`: its workers, and the forkserver's."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _ppid_and_state(int(entry))
            if info is not None and info[1] != "Z":
                parents[int(entry)] = info[0]
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def worker_pids() -> set[int]:
    """chute's worker processes: descendants of this process, less the forkserver and the
    resource tracker, which multiprocessing keeps for as long as this process lives."""
    out = set()
    for pid in descendants(os.getpid()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        info = _ppid_and_state(pid)
        direct_child = info is not None and info[0] == os.getpid()
        if direct_child and (b"forkserver" in cmdline or b"resource_tracker" in cmdline):
            continue
        out.add(pid)
    return out


def shm_entries() -> set[str]:
    return {e for e in os.listdir("/dev/shm") if "chute" in e}


def wait_until(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return bool(cond())


def test_same_output_for_0_1_2_3_4_8_workers() -> None:
    reference = mpp.as_list(mpp.rich_pipeline(0))
    assert len(reference) > 20
    for workers in (1, 2, 3, 4, 8):
        assert_trees_equal(mpp.as_list(mpp.rich_pipeline(workers)), reference)


@given(
    n=st.integers(1, 120),
    use_filter=st.booleans(),
    batch=st.integers(0, 6),
    iter_filter=st.booleans(),
    workers=st.sampled_from([1, 2, 3]),
)
@settings(max_examples=8, deadline=None)
def test_random_pipelines_do_not_depend_on_workers(
    n: int, use_filter: bool, batch: int, iter_filter: bool, workers: int
) -> None:
    def build(w: int) -> chute.IterDataset[Any]:
        ds = chute.MapDataset.range(n).shuffle(seed=3).random_map(mpp.jitter, seed=1)
        if use_filter:
            ds = ds.filter(mpp.keep)
        it: chute.IterDataset[Any] = ds.to_iter_dataset()
        if iter_filter:
            it = it.filter(mpp.lambda_free_odd)
        if batch:
            it = it.batch(batch)
        return it.mp_prefetch(chute.MultiprocessingOptions(num_workers=w))

    assert_trees_equal(mpp.as_list(build(workers)), mpp.as_list(build(0)))


@pytest.mark.parametrize(("taken_with", "restored_with"), [(2, 3), (3, 0), (0, 2), (1, 4)])
def test_state_restores_across_worker_counts(taken_with: int, restored_with: int) -> None:
    assert_equal_output_after_checkpoint(
        mpp.rich_pipeline(taken_with),
        restore_into=mpp.rich_pipeline(restored_with),
        steps=[0, 1, 7, 20, 31],
    )


def test_state_is_small_and_the_same_with_or_without_workers() -> None:
    states = []
    for workers in (0, 3):
        it = iter(mpp.rich_pipeline(workers))
        for _ in range(9):
            next(it)
        states.append(it.get_state())
        it.close()
    assert states[0] == states[1]
    assert len(json.dumps(states[0])) < 400


def test_dataloader_worker_count() -> None:
    def loader(workers: int) -> chute.DataLoader:
        return chute.DataLoader(
            data_source=list(range(300)),
            sampler=chute.IndexSampler(300, shuffle=True, seed=2, num_epochs=2),
            operations=[mpp.keep_transform(), chute.Batch(8)],
            worker_count=workers,
        )

    reference = [b.tolist() for b in loader(0)]
    assert [b.tolist() for b in loader(2)] == reference
    it = iter(loader(2))
    for _ in range(11):
        next(it)
    state = it.get_state()
    it.close()
    other = iter(loader(3))
    other.set_state(state)
    assert [b.tolist() for b in other] == reference[11:]


def test_arrays_come_through_shared_memory_and_stay_valid() -> None:
    def build(w: int) -> chute.IterDataset[Any]:
        ds = chute.MapDataset.range(40).map(mpp.big_array).batch(4).to_iter_dataset()
        return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=w))

    it = iter(build(2))
    held = [next(it) for _ in range(10)]
    it.close()
    del it
    gc.collect()
    for _ in range(3):  # churn: new pools reuse memory; held arrays must not change
        mpp.as_list(build(2))
    reference = mpp.as_list(build(0))
    assert_trees_equal(held, reference)
    assert held[0]["image"].shape == (4, 64, 1024)


def test_batches_built_in_shared_memory_stay_valid_while_the_stream_goes_on() -> None:
    # Each batch (4 x 256 KiB) is stacked straight into the worker's slab and handed over
    # without a copy. Holding every 7th while 150 more pass through the same workers
    # (more than their slabs hold) must neither change them nor stall the stream.
    def build(w: int) -> chute.IterDataset[Any]:
        batches = chute.MapDataset.range(600).map(mpp.big_array).batch(4)
        ds = batches.to_iter_dataset().map(mpp.scale_image)  # runs in the workers
        return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=w))

    held = []
    with iter(build(2)) as it:
        for k, batch in enumerate(it):
            if k % 7 == 0:
                held.append(batch)
    reference = mpp.as_list(build(0))
    assert_trees_equal(held, reference[::7])
    assert len(held) == 22 and held[0]["image"][0, 0, 0] == 0.5  # replaced in a worker


def test_start_prefetch_starts_workers_before_next() -> None:
    before = worker_pids()
    it = iter(mpp.rich_pipeline(2))
    it.start_prefetch()
    it.start_prefetch()
    assert wait_until(lambda: len(worker_pids() - before) >= 2)
    assert next(it) == mpp.as_list(mpp.rich_pipeline(0))[0]
    it.close()
    assert wait_until(lambda: not (worker_pids() - before))


def test_worker_exception_has_traceback_stage_and_index() -> None:
    ds = chute.MapDataset.range(40).map(mpp.fail_at_13).to_iter_dataset()
    it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
    before = shm_entries()
    with pytest.raises(ValueError, match="cannot handle 13") as info:
        list(it)
    notes = "\n".join(info.value.__notes__)
    assert "MapMapDataset(transform=fail_at_13" in notes and "element index 13" in notes
    assert "raised in worker" in notes
    cause = info.value.__cause__
    assert cause is not None and "fail_at_13" in str(cause)  # the worker's traceback text
    assert wait_until(lambda: not worker_pids())
    assert wait_until(lambda: shm_entries() <= before)


@pytest.mark.timeout(60)  # a hang guard: the death must be reported, not waited out
def test_killed_worker_is_reported_within_seconds() -> None:
    ds = chute.MapDataset.range(10**7).map(mpp.double).to_iter_dataset()
    it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
    before = worker_pids()
    it.start_prefetch()
    next(it)
    new = worker_pids() - before or worker_pids()
    victim = max(new)
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(chute.multiprocessing.WorkerDiedError, match=r"SIGKILL|signal 9|killed"):
        for _ in range(10**7):
            next(it)
    assert wait_until(lambda: not (worker_pids() & new))


def test_breaking_out_and_garbage_collection_leave_nothing() -> None:
    before_shm = shm_entries()
    before = worker_pids()
    for _ in range(3):
        for i, _batch in enumerate(mpp.rich_pipeline(2)):
            if i == 3:
                break
    gc.collect()
    assert wait_until(lambda: not (worker_pids() - before))
    assert wait_until(lambda: shm_entries() <= before_shm)


def test_unpicklable_stage_is_named_before_any_worker_starts() -> None:
    ds = chute.MapDataset.range(10).map(mpp.HoldsALock()).to_iter_dataset()
    before = worker_pids()
    with pytest.raises(TypeError, match="cannot pickle") as info:  # the pickler's own, as Grain
        iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
    assert "stage MapMapDataset(transform=HoldsALock" in "\n".join(info.value.__notes__)
    assert not (worker_pids() - before)


def test_worker_init_fn_runs_in_each_worker(tmp_path: Path) -> None:
    ds = chute.MapDataset.range(50).to_iter_dataset()
    opts = chute.MultiprocessingOptions(num_workers=3)
    assert mpp.as_list(ds.mp_prefetch(opts, worker_init_fn=mpp.WriteMarker(tmp_path))) == list(
        range(50)
    )
    names = sorted(p.name.rsplit("-pid-", 1)[0] for p in tmp_path.iterdir())
    assert names == ["worker-0-of-3", "worker-1-of-3", "worker-2-of-3"]


def test_interpreter_exit_and_keyboard_interrupt_leave_nothing(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        import mp_pipelines as mpp
        it = iter(mpp.rich_pipeline(2))
        next(it)
        try:
            for i, b in enumerate(it):
                if i == 2:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        it2 = iter(mpp.rich_pipeline(2))
        next(it2)
        print(os.getpid(), flush=True)
        """
    )
    before = shm_entries()
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stderr.strip() == "", out.stderr
    pid = int(out.stdout.strip())
    assert wait_until(lambda: not descendants(pid))
    assert wait_until(lambda: shm_entries() <= before)


def test_options_errors() -> None:
    with pytest.raises(ValueError, match=r"num_workers=-1 is invalid"):
        chute.MultiprocessingOptions(num_workers=-1)
    with pytest.raises(TypeError, match=r"not a MultiprocessingOptions"):
        chute.MapDataset.range(3).to_iter_dataset().mp_prefetch(2)  # type: ignore[arg-type]


def test_script_without_main_guard_just_runs(tmp_path: Path) -> None:
    script = tmp_path / "no_guard.py"
    script.write_text(
        "import chute\n"
        "ds = chute.MapDataset.range(100).to_iter_dataset()\n"
        "print(list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2))))\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(list(range(100)))
    assert out.stderr == ""


def test_large_list_source_is_shared_not_copied() -> None:
    data = [(i, f"record-{i}") for i in range(30_000)]

    def build(w: int) -> chute.IterDataset[Any]:
        ds = chute.MapDataset.source(data).shuffle(seed=5).map(mpp.first).to_iter_dataset()
        return ds.batch(100).mp_prefetch(chute.MultiprocessingOptions(num_workers=w))

    def lists(pid: int | str = "self") -> set[int]:
        return shm_helpers.held_shared_files(pid, shm_helpers.LIST_MAGIC)

    before = lists()
    it = iter(build(2))
    first = next(it)
    made = lists() - before
    assert len(made) == 1  # one shared copy, whatever the number of workers
    assert all(lists(pid) == made for pid in worker_pids())  # handed to each worker
    assert not shm_helpers.chute_names({os.getpid(), *worker_pids()})  # with no name
    rest = list(it)
    it.close()
    assert_trees_equal([first, *rest], mpp.as_list(build(0)))
    assert not made & lists()  # let go when the workers stop: the kernel frees it


def test_shared_list_files_of_dead_processes_are_swept() -> None:
    stale = Path("/dev/shm") / "chute_list_999999999_00ff"
    stale.write_bytes(b"left by a killed process")
    os.utime(stale, (0, 0))  # old enough not to be a file in creation
    ds = chute.MapDataset.source(list(range(20_000))).to_iter_dataset()
    assert mpp.as_list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1)))[:3] == [0, 1, 2]
    assert not stale.exists()


class _Count(chute.DatasetIterator[int]):
    stage = "count"

    def __init__(self, n: int) -> None:
        super().__init__()
        self._n, self._i = n, 0

    def __next__(self) -> int:
        if self._i >= self._n:
            raise StopIteration
        self._i += 1
        return self._i - 1

    def own_state(self) -> dict[str, Any]:
        return {"i": self._i}

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        self._i = state["i"]


class CountStream(chute.IterDataset[int]):
    """A user-defined stream with no random-access part."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self._n = n

    def _make_iterator(self) -> chute.DatasetIterator[int]:
        return _Count(self._n)


def test_stream_without_random_access_part_runs_in_process_and_says_so() -> None:
    ds = CountStream(10).map(mpp.double)
    before = worker_pids()
    with pytest.warns(
        UserWarning, match=r"cannot be split.*no random-access part.*runs in this process"
    ):
        it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
    assert list(it) == [2 * i for i in range(10)]
    assert not (worker_pids() - before)
    assert_equal_output_after_checkpoint(
        ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=0)), max_elements=10
    )


def test_the_first_element_is_computed_by_the_consumer_while_the_workers_start() -> None:
    """The first batch does not wait for the workers' start: the consumer computes the
    first element itself, the workers the ones after it; the output is the same."""
    from mp_pipelines import with_pid

    ds = chute.MapDataset.range(40).map(with_pid).to_iter_dataset()
    it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2)))
    got = list(it)
    assert [x for x, _ in got] == list(range(40))
    assert got[0][1] == os.getpid()
    assert {pid for _, pid in got[1:]} - {os.getpid()}, "the workers computed the others"
    assert all(pid != os.getpid() for _, pid in got[1:])
