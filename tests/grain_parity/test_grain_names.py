"""Grain's names added for `import chute as grain`: they run on chute's engine."""

from __future__ import annotations

import functools
import gc
import os
import pickle
import subprocess
import sys
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chute as grain
import chute.python
from chute.testing import assert_equal_output_after_checkpoint


def _source() -> grain.sources.RangeDataSource:
    return grain.sources.RangeDataSource(0, 20, 1)


def test_operations_in_a_data_loader_match_the_transforms_for_any_worker_count() -> None:
    ops = [
        grain.python.MapOperation(lambda x: x * 10),
        grain.python.FilterOperation(lambda x: x % 30 != 0),
        grain.python.RandomMapOperation(lambda x, rng: x + int(rng.integers(0, 3))),
        grain.python.BatchOperation(batch_size=4),
    ]

    def loader(workers: int) -> list[list[int]]:
        sampler = grain.IndexSampler(20, shuffle=True, seed=3, num_epochs=1)
        dl = grain.DataLoader(
            data_source=_source(), sampler=sampler, operations=ops, worker_count=workers
        )
        return [b.tolist() for b in dl]

    batches = loader(0)
    assert batches == loader(2)
    assert sum(len(b) for b in batches) == 13


def test_operations_called_on_records() -> None:
    meta = grain.RecordMetadata(index=0, record_key=7, rng=np.random.default_rng(0))
    records = [grain.Record(meta, x) for x in range(5)]
    mapped = list(grain.python.MapOperation(lambda x: x + 1)(iter(records)))
    assert [r.data for r in mapped] == [1, 2, 3, 4, 5]
    assert mapped[0].metadata.record_key is None
    kept = list(grain.python.FilterOperation(lambda x: x % 2)(iter(records)))
    assert [r.data for r in kept] == [1, 3]
    batches = list(grain.python.BatchOperation(2, drop_remainder=True)(iter(records)))
    assert [r.data.tolist() for r in batches] == [[0, 1], [2, 3]]


def test_load_is_a_data_loader() -> None:
    loader = grain.load(_source(), num_epochs=1, shuffle=True, seed=1, batch_size=8)
    assert isinstance(iter(loader), grain.DataLoaderIterator)
    assert sorted(np.concatenate(list(loader)).tolist()) == list(range(20))
    assert loader.multiprocessing_options.num_workers == 0


def test_apply_and_prefetch() -> None:
    ds = grain.MapDataset.range(6).apply(grain.transforms.Batch(4))
    assert [b.tolist() for b in ds] == [[0, 1, 2, 3], [4, 5]]
    it = grain.MapDataset.range(6).to_iter_dataset()
    out = it.prefetch(grain.MultiprocessingOptions(num_workers=1))
    assert list(out) == list(range(6))
    flat = grain.experimental.FlatMapTransform
    assert issubclass(grain.experimental.MapWithIndexTransform, grain.MapWithIndex)
    assert flat is not None


def test_multithread_prefetch_checkpoints_and_keeps_order() -> None:
    ds = grain.MapDataset.range(50).shuffle(seed=2).to_iter_dataset().filter(lambda x: x % 3)
    threaded = grain.experimental.multithread_prefetch(ds.batch(4), num_threads=3, buffer_size=2)
    assert [b.tolist() for b in threaded] == [b.tolist() for b in ds.batch(4)]
    assert_equal_output_after_checkpoint(threaded)


def test_next_index() -> None:
    it = iter(grain.MapDataset.range(10).to_iter_dataset().map(lambda x: x + 100))
    next(it)
    assert grain.experimental.get_next_index(it) == 1
    grain.experimental.set_next_index(it, 8)
    assert list(it) == [108, 109]


def test_file_iter_datasets(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"x": list(range(10))}), path, row_group_size=3)
    ds = grain.experimental.ParquetIterDataset(str(path))
    assert [row["x"] for row in ds] == list(range(10))
    assert_equal_output_after_checkpoint(ds)


def test_shared_memory_data_source_pickles_by_name() -> None:
    source = grain.sources.SharedMemoryDataSource([1, 2, 3])
    try:
        copy = pickle.loads(pickle.dumps(source))
        assert list(copy) == [1, 2, 3]
        ds = grain.MapDataset.source(source).map(lambda x: x * 2)
        assert list(ds) == [2, 4, 6]
        copy.close()
    finally:
        source.close()
        source.unlink()


def test_shared_memory_data_source_removes_its_segment() -> None:
    """The source that made a segment removes it when it goes, or at exit (no warning of a
    leaked segment); one attached by name leaves it."""
    source = grain.sources.SharedMemoryDataSource([1, 2, 3])
    name = source.shm.name
    attached = grain.sources.SharedMemoryDataSource(name=name)
    del attached
    gc.collect()
    again = grain.sources.SharedMemoryDataSource(name=name)
    assert [again[i] for i in range(len(again))] == [1, 2, 3]
    del again
    del source
    gc.collect()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name)
    script = (
        "import chute\n"
        "source = chute.sources.SharedMemoryDataSource(['a', b'b', 3])\n"
        "print(source.shm.name)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0 and "leaked" not in proc.stderr, proc.stderr
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(proc.stdout.strip())


def test_element_spec_and_batch_and_pad() -> None:
    fn = functools.partial(grain.experimental.batch_and_pad, batch_size=4, pad_value=-1)
    ds = grain.MapDataset.range(6).map(lambda x: {"x": np.full(2, x)}).batch(4, batch_fn=fn)
    assert ds[1]["x"].tolist() == [[4, 4], [5, 5], [-1, -1], [-1, -1]]
    spec = grain.experimental.get_element_spec(ds)
    assert spec["x"].shape == (4, 2)
