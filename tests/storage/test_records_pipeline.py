"""`.crec` and the other sources inside a chute pipeline: shuffle, map, checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import chute
from chute.records import ShardedRecordWriter
from chute.sources import JsonlDataSource, RecordFileDataSource
from chute.testing import assert_equal_output_after_checkpoint


def _dataset(tmp_path: Path, records: list[bytes]) -> Path:
    out = tmp_path / "ds"
    with ShardedRecordWriter(out, records_per_shard=700, compression="zstd") as w:
        for r in records:
            w.write(r)
    return out


def test_shuffle_map_end_to_end(tmp_path: Path, corpus_records: list[bytes]) -> None:
    records = corpus_records[:2000]
    src = RecordFileDataSource(_dataset(tmp_path, records))
    ds = chute.MapDataset.source(src).shuffle(seed=1).map(json.loads)
    got = list(iter(ds))
    assert len(got) == len(records)
    assert sorted(json.dumps(g, sort_keys=True) for g in got) == sorted(
        json.dumps(json.loads(r), sort_keys=True) for r in records
    )
    assert got == [json.loads(records[i]) for i in _order(len(records))]
    same = chute.MapDataset.source(JsonlDataSource(_jsonl(tmp_path, records))).shuffle(seed=1)
    assert list(iter(same)) == got


def _order(n: int) -> list[int]:
    return list(iter(chute.MapDataset.range(n).shuffle(seed=1)))


def _jsonl(tmp_path: Path, records: list[bytes]) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(records) + b"\n")
    return path


def test_checkpoint_restore(tmp_path: Path, corpus_records: list[bytes]) -> None:
    src = RecordFileDataSource(_dataset(tmp_path, corpus_records[:1500]))
    ds = (
        chute.MapDataset.source(src)
        .shuffle(seed=1)
        .map(lambda r: len(json.loads(r)["description"]))
        .batch(16)
    )
    assert_equal_output_after_checkpoint(ds, max_elements=40, steps=[0, 1, 17, 39, 40])
