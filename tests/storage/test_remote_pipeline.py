"""A pipeline over data in a bucket (shuffle, map, batch, mp_prefetch with 2 workers)
checkpointed and restored exactly: the workers reopen the remote source with the
storage options it carries."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np

import chute
from chute import sources
from chute.records import RecordWriter


def _double(x: bytes) -> int:
    return int(x) * 2


def test_remote_pipeline_restores_exactly_with_workers(s3_server: Any, tmp_path: Path) -> None:
    bucket = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    path = tmp_path / "d.crec"
    with RecordWriter(path) as w:
        for i in range(400):
            w.write(b"%d" % i)
    s3_server.fs().put_file(str(path), f"{bucket}/d.crec")
    src = sources.RecordFileDataSource(f"{bucket}/d.crec", storage_options=s3_server.options)

    def pipeline() -> chute.IterDataset[Any]:
        return (
            chute.MapDataset.source(src)
            .shuffle(seed=7)
            .map(_double)
            .to_iter_dataset()
            .batch(16)
            .mp_prefetch(chute.multiprocessing.MultiprocessingOptions(num_workers=2))
        )

    it = iter(pipeline())
    first = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(it.get_state()))
    rest = [b.tolist() for b in it]
    assert sorted(np.concatenate(first + [np.array(r) for r in rest]).tolist()) == [
        2 * i for i in range(400)
    ]
    it2 = iter(pipeline())
    it2.set_state(state)
    assert [b.tolist() for b in it2] == rest
