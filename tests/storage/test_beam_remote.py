"""chute.beam writing into a bucket of a real S3-compatible server (moto on 127.0.0.1):
one DirectRunner job with 2 worker processes, which get the storage options pickled in
the transforms; then `chute verify` and the source on the URL, and a rerun's check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("apache_beam")

import chute.beam
from chute._src.storage.convert.beam.shards import finish, write_shard
from chute.cli import main
from chute.sources import RecordFileDataSource

pytestmark = pytest.mark.slow


def _jsonl(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"i": i, "text": "chute " * (i % 17)}) + "\n")
    return path


def test_jsonl_to_crec_shards_in_a_bucket_with_two_beam_workers(
    s3_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = _jsonl(tmp_path / "in.jsonl", 1200)
    options = s3_server.options
    so = ["--storage-options", json.dumps(options)]
    out = f"{s3_server.bucket('beam-out')}/prefix"
    argv = ["convert", str(src), out, "--runner", "beam", "--shards", "3", "--num-workers", "2"]
    assert main([*argv, *so]) == 0
    assert f"wrote 1,200 records to {out}" in capsys.readouterr().out
    names = sorted(p.rsplit("/", 1)[-1] for p in s3_server.fs().ls("beam-out/prefix"))
    assert names == ["manifest.json", *(f"part-{k:05d}-of-00003.crec" for k in range(3))]
    assert main(["verify", out, "--no-progress", *so]) == 0
    assert "OK: 1,200 records" in capsys.readouterr().out
    local = tmp_path / "local"
    assert main(["convert", str(src), str(local), "--shards", "3", "--no-progress"]) == 0
    remote_ds = RecordFileDataSource(out, storage_options=options)
    local_ds = RecordFileDataSource(str(local))
    assert len(remote_ds) == len(local_ds) == 1200
    every = list(range(1200))
    assert remote_ds.__getitems__(every) == local_ds.__getitems__(every)

    # A rerun after a failure keeps the complete shards in the bucket (recognised by
    # range reads of their header and trailer): put the bucket back in the state of a job
    # that died after writing shards 0 and 2.
    fs = s3_server.fs()
    shard0 = RecordFileDataSource(f"{out}/part-00000-of-00003.crec", storage_options=options)
    job_id = shard0.metadata["job"]
    assert shard0.metadata["shard"] == [0, 3]
    fs.rm(["beam-out/prefix/manifest.json", "beam-out/prefix/part-00001-of-00003.crec"])
    doc = {"format": "chute-shard-job", "job": job_id, "shards": 3}
    fs.pipe("beam-out/prefix/.chute-job.json", json.dumps(doc).encode())
    again = chute.beam.ConvertRecords(
        [str(src)], out, num_shards=3, to_format="crec", storage_options=options
    )
    assert again.completed_before == [0, 2]
    # What the rerun's workers and its last step do: a kept shard is not rewritten, the
    # missing one is written, then the manifest; the dataset verifies again.
    before = fs.info("beam-out/prefix/part-00000-of-00003.crec")["ETag"]
    assert write_shard(again.spec, 0, [b"not these"]).num_records == 400
    assert fs.info("beam-out/prefix/part-00000-of-00003.crec")["ETag"] == before
    lo, hi = again.spec.bounds(1)
    write_shard(again.spec, 1, (local_ds[i] for i in range(lo, hi)))
    finish(again.spec, [])
    assert not fs.exists("beam-out/prefix/.chute-job.json")
    assert main(["verify", out, "--no-progress", *so]) == 0
    fs.invalidate_cache()
    again_ds = RecordFileDataSource(out, storage_options=options)
    assert again_ds.__getitems__(every) == local_ds.__getitems__(every)
    # A finished dataset in the bucket is never written over.
    with pytest.raises(FileExistsError, match=r"prefix already holds a dataset \(manifest"):
        chute.beam.ConvertRecords(
            [str(src)], out, num_shards=2, to_format="crec", storage_options=options
        )
