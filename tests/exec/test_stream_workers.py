"""Streams in worker processes: shards read whole in workers, merged by the interleave
rule, so the output and the states are the same for any number of workers."""

from __future__ import annotations

import json
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.experimental import InterleaveIterDataset, JsonlIterDataset
from chute.testing import assert_equal_output_after_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from test_mp_prefetch import worker_pids

import shard_helpers as sh


def _opts(workers: int) -> chute.MultiprocessingOptions:
    return chute.MultiprocessingOptions(num_workers=workers)


def _write_jsonl(tmp_path: Path, counts: list[int]) -> list[str]:
    paths = []
    for f, n in enumerate(counts):
        path = tmp_path / f"shard-{f:02d}.jsonl"
        path.write_text("".join(json.dumps({"shard": f, "row": r}) + "\n" for r in range(n)))
        paths.append(str(path))
    return paths


def _jsonl_pipeline(paths: list[str], workers: int) -> chute.IterDataset[Any]:
    ds = JsonlIterDataset(paths, cycle_length=3).map(sh.key).filter(sh.keep)
    return ds.batch(4, batch_fn=list).mp_prefetch(_opts(workers))


def test_jsonl_shards_same_output_for_0_1_2_4_workers(tmp_path: Path) -> None:
    paths = _write_jsonl(tmp_path, [5, 0, 23, 9, 1, 17, 12])
    before = worker_pids()
    reference = list(_jsonl_pipeline(paths, 0))
    # The rule, written out: 3 slots in turn, a slot reached empty takes the next shard,
    # a filtered row still takes its turn.
    counts = [5, 0, 23, 9, 1, 17, 12]
    shards = [[(f, r) for r in range(n)] for f, n in enumerate(counts)]
    expected = [key for key in sh_interleave(shards, 3) if sh.keep(key)]
    assert [k for batch in reference for k in batch] == expected
    for workers in (1, 2, 4):
        assert list(_jsonl_pipeline(paths, workers)) == reference, workers
    assert not (worker_pids() - before)  # every worker stopped


def sh_interleave(shards: list[list[Any]], cycle: int) -> list[Any]:
    """The interleave rule, as plainly as it can be written: `cycle` slots visited in turn.
    A slot reached empty takes the next shard. A slot gives the next element of its shard;
    one whose shard has ended gives nothing and is emptied."""
    slots: list[list[Any] | None] = [None] * cycle
    waiting = [list(s) for s in shards]
    out: list[Any] = []
    pos = 0
    while waiting or any(s is not None for s in slots):
        if slots[pos] is None and waiting:
            slots[pos] = waiting.pop(0)
        slot = slots[pos]
        if slot:
            out.append(slot.pop(0))
        else:
            slots[pos] = None
        pos = (pos + 1) % cycle
    return out


def _masked_crc(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize(("taken_with", "restored_with"), [(0, 2), (2, 4), (4, 1), (1, 0)])
def test_state_taken_with_n_workers_restores_with_m(
    tmp_path: Path, taken_with: int, restored_with: int
) -> None:
    paths = _write_jsonl(tmp_path, [11, 3, 20, 7, 14])
    assert_equal_output_after_checkpoint(
        _jsonl_pipeline(paths, taken_with),
        restore_into=_jsonl_pipeline(paths, restored_with),
        steps=[0, 1, 4, 9, 13],
    )


def _user_shards(workers: int, factory: type[sh.Rows] = sh.Rows, **kw: Any) -> Any:
    shards = [chute.IterDataset.source(factory(s, 3 + 5 * s, **kw)) for s in range(6)]
    ds = InterleaveIterDataset(shards, cycle_length=4, iter_buffer_size=3)
    return ds.map(sh.key).mp_prefetch(_opts(workers))


def test_user_iterators_over_a_list_of_shards() -> None:
    reference = list(_user_shards(0))
    assert sorted(reference) == sorted((s, r) for s in range(6) for r in range(3 + 5 * s))
    assert list(_user_shards(2)) == reference
    # Each shard resumes by counting (its factory makes it again and skips).
    assert_equal_output_after_checkpoint(
        _user_shards(2), restore_into=_user_shards(0), steps=[0, 7, 30, 60]
    )


def test_a_failing_shard_names_itself_and_keeps_the_original_traceback() -> None:
    def run(workers: int) -> tuple[list[Any], BaseException]:
        it = iter(_user_shards(workers, sh.FailingRows, at=4))
        out: list[Any] = []
        with pytest.raises(ValueError, match="bad row 4 in shard") as info:
            for x in it:
                out.append(x)
        return out, info.value

    before_failure, _ = run(0)
    got, error = run(2)
    assert got == before_failure  # the elements before the failing read, as in-process
    notes = "\n".join(getattr(error, "__notes__", []))
    assert "raised reading shard" in notes and "in worker" in notes, notes
    assert "FailingRows" in notes or "IterableSource" in notes, notes
    assert "raise ValueError" in str(error.__cause__)  # the worker's own traceback


def test_unsplittable_stream_warns_and_says_what_to_do() -> None:
    ds = chute.IterDataset.source(sh.Rows(0, 5)).map(sh.key)
    with pytest.warns(UserWarning, match=r"cannot be split.*InterleaveIterDataset"):
        it = iter(ds.mp_prefetch(_opts(2)))
    assert list(it) == [(0, r) for r in range(5)]


def test_parallelism_changes_neither_order_nor_state() -> None:
    def ds(parallelism: int | None) -> chute.IterDataset[Any]:
        shards = [chute.IterDataset.source(sh.SlowRows(s, 6, 0.002)) for s in range(5)]
        return InterleaveIterDataset(
            shards, cycle_length=3, iter_buffer_size=2, parallelism=parallelism
        ).map(sh.key)

    reference = list(ds(0))
    assert reference == sh_interleave([[(s, r) for r in range(6)] for s in range(5)], 3)
    for parallelism in (1, None, 8):
        it = iter(ds(parallelism))
        got = [next(it) for _ in range(11)]
        state = it.get_state()
        got += list(it)
        assert got == reference, parallelism
        again = iter(ds(0))
        again.set_state(json.loads(json.dumps(state)))
        assert list(again) == reference[11:]
    with pytest.raises(ValueError, match=r"parallelism=-1 is invalid: it must be an int >= 0"):
        InterleaveIterDataset([], cycle_length=1, parallelism=-1)


def test_parquet_and_tfrecord_iter_datasets_as_grain(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    grain = pytest.importorskip("grain")
    paths = []
    for f in range(3):
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(pa.table({"x": [100 * f + i for i in range(4 + f)]}), path)
        paths.append(str(path))
    ours = [r["x"] for r in chute.experimental.ParquetIterDataset(paths)]
    theirs = [r["x"] for r in grain.experimental.ParquetIterDataset(paths)]
    assert ours == theirs
    two = chute.experimental.ParquetIterDataset(paths).map(lambda r: r["x"])
    assert list(two.mp_prefetch(_opts(2))) == ours

    tf_paths = []
    for f in range(2):
        path = tmp_path / f"part-{f}.tfrecord"
        with open(path, "wb") as out:
            for i in range(3):
                data = f"{f}-{i}".encode()
                head = struct.pack("<Q", len(data))
                out.write(head + struct.pack("<I", _masked_crc(head)))
                out.write(data + struct.pack("<I", _masked_crc(data)))
        tf_paths.append(str(path))
    records = chute.experimental.TFRecordIterDataset(tf_paths, cycle_length=2)
    assert list(records) == [b"0-0", b"1-0", b"0-1", b"1-1", b"0-2", b"1-2"]
    assert list(grain.experimental.TFRecordIterDataset(tf_paths[0])) == [b"0-0", b"0-1", b"0-2"]
    assert_equal_output_after_checkpoint(records.mp_prefetch(_opts(2)), restore_into=records)


@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=7),
    cycle=st.integers(1, 5),
)
@settings(max_examples=20, deadline=None)
def test_file_streams_follow_the_interleave_rule(counts: list[int], cycle: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        paths = _write_jsonl(Path(d), counts)
        got = [sh.key(x) for x in JsonlIterDataset(paths, cycle_length=cycle)]
    shards = [[(f, r) for r in range(n)] for f, n in enumerate(counts)]
    assert got == sh_interleave(shards, cycle)


def test_shards_are_dealt_evenly_over_the_workers(tmp_path: Path) -> None:
    """The merge opens shards one after the other, each once the one before has given an
    element, so the workers' queues are often equally empty when a shard is placed: it
    goes to the worker holding the fewest shards, and each worker reads half of them (by
    queue length alone, the first worker took 15 of 16 and the other idled)."""
    from mp_pipelines import with_pid

    paths = _write_jsonl(tmp_path, [20] * 16)
    ds = JsonlIterDataset(paths, cycle_length=16).map(with_pid).mp_prefetch(_opts(2))
    got = list(ds)
    assert [x for x, _ in got] == list(JsonlIterDataset(paths, cycle_length=16))
    by_pid: dict[int, set[int]] = {}
    for x, pid in got:
        by_pid.setdefault(pid, set()).add(x["shard"])
    assert sorted(len(shards) for shards in by_pid.values()) == [8, 8], by_pid
