"""chute.beam on Beam's DirectRunner with 2 worker processes (multi-processing mode).

Beam starts slowly (~3 s a job), so each job runs once per module (fixtures) and the
tests check its outputs; the module is marked slow.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest

pytest.importorskip("apache_beam", reason="chute.beam needs the [beam] extra")

import chute
import chute.beam
import chute.cli
from chute.records import verify
from chute.sources import ArrayRecordDataSource, RecordFileDataSource

TESTS = Path(__file__).resolve().parents[1]  # beam_helpers, for Beam's workers
sys.path.insert(0, str(TESTS))
import beam_helpers  # noqa: E402

pytestmark = pytest.mark.slow


def _masked(data: bytes) -> int:
    c = crc32c.crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def write_tfrecord(path: Path, records: list[bytes]) -> Path:
    with open(path, "wb") as f:
        for r in records:
            head = struct.pack("<Q", len(r))
            f.write(head + struct.pack("<I", _masked(head)) + r + struct.pack("<I", _masked(r)))
    return path


def records_of(src: Any) -> list[bytes]:
    return [bytes(src[i]) for i in range(len(src))]


@pytest.fixture(scope="module", autouse=True)
def workers_import_helpers() -> Iterator[None]:
    """Beam's worker processes import beam_helpers through PYTHONPATH."""
    with pytest.MonkeyPatch.context() as mp:
        old = os.environ.get("PYTHONPATH", "")
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS), old) if p))
        yield


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    # Seed 001's input: a sharded TFRecord dataset (TFDS-style names).
    for k in range(3):
        recs = [rng.bytes(int(rng.integers(0, 200))) for _ in range(700 + 50 * k)]
        write_tfrecord(d / f"train.tfrecord-{k:05d}-of-00003", recs)
    words = ["alpha", "beta", "gamma", "delta", "chute", "beam"]
    with open(d / "text.jsonl", "w") as f:
        for i in range(1500):
            text = " ".join(words[(i * j) % 6] for j in range(i % 23))
            f.write(json.dumps({"i": i, "text": text}) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"i": list(range(900)), "text": [f"row {i} " * (i % 9) for i in range(900)]})
    pq.write_table(table, d / "rows.parquet", row_group_size=128)
    return d


def beam_convert(inputs: list[Path], out: Path, **kw: Any) -> Any:
    kw.setdefault("num_workers", 2)
    kw.setdefault("records_per_range", 256)
    return chute.beam.convert([str(p) for p in inputs], str(out), **kw)


def shard_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# -- seed 001: a sharded TFRecord dataset to ArrayRecord, read back with a global shuffle --


@pytest.fixture(scope="module")
def seed001(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("seed001") / "train"
    result = beam_convert([data / "train.tfrecord-*"], out, shards=4, to_format="arrayrecord")
    return out, result


def test_seed_001_tfrecord_to_array_record_then_a_global_shuffle(
    data: Path, seed001: tuple[Path, Any]
) -> None:
    out, result = seed001
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json"] + [f"part-{k:05d}-of-00004.array_record" for k in range(4)]
    originals = records_of(chute.sources.TFRecordDataSource(str(data / "train.tfrecord-*")))
    assert result.records == len(originals) == 2250
    source = ArrayRecordDataSource(str(out))  # the directory: its manifest lists the shards
    assert records_of(source) == originals
    shuffled = chute.MapDataset.source(source).shuffle(seed=42)
    expected = chute.MapDataset.source(originals).shuffle(seed=42)
    assert list(shuffled) == list(expected)
    # Shard k holds positions [k*n//4, (k+1)*n//4), whatever worker wrote it.
    counts = [len(ArrayRecordDataSource(str(p))) for p in sorted(out.glob("*.array_record"))]
    assert counts == [562, 563, 562, 563]
    # `chute verify` reads the directory; its manifest's checksums catch a swapped shard.
    assert chute.cli.main(["verify", str(out)]) == 0


def test_seed_001_shards_match_single_process_convert(
    data: Path, seed001: tuple[Path, Any], tmp_path: Path
) -> None:
    out, _ = seed001
    local = tmp_path / "local"
    inputs = sorted(str(p) for p in data.glob("train.tfrecord-*"))
    assert (
        chute.cli.main(
            [
                "convert",
                *inputs,
                str(local),
                "--shards",
                "4",
                "--to",
                "arrayrecord",
                "--no-progress",
            ]
        )
        == 0
    )

    # The same shards, under the same names, holding the same records.
    def shards(d: Path) -> dict[str, list[bytes]]:
        return {p.name: records_of(ArrayRecordDataSource(str(p))) for p in d.glob("part-*")}

    assert shards(local) == shards(out) and len(shards(local)) == 4


# -- JSONL to .crec with a tokenize map, a random crop and a filter ------------------------


@pytest.fixture(scope="module")
def preprocessed(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prep") / "tokens"
    beam_convert([data / "text.jsonl"], out, shards=3, transforms=beam_helpers.PREPROCESS, seed=7)
    return out


def online_elements(source: Any, transforms: list[Any], seed: int) -> list[bytes]:
    ds = chute.MapDataset.source(source).seed(seed).apply(transforms)
    return list(ds.to_iter_dataset())


def test_preprocessing_gives_exactly_the_online_pipelines_elements(
    data: Path, preprocessed: Path
) -> None:
    converted = records_of(RecordFileDataSource(str(preprocessed)))
    online = online_elements(
        chute.sources.JsonlDataSource(str(data / "text.jsonl")), beam_helpers.PREPROCESS, 7
    )
    assert converted == online
    # The filter dropped the empty texts (every 23rd line), the crop drew per element.
    assert len(converted) == 1500 - len(range(0, 1500, 23))
    assert max(len(r) for r in converted) == 8 * 4
    other_seed = online_elements(
        chute.sources.JsonlDataSource(str(data / "text.jsonl")), beam_helpers.PREPROCESS, 8
    )
    assert other_seed != online


def test_preprocessing_matches_single_process_convert(
    data: Path, preprocessed: Path, tmp_path: Path
) -> None:
    out = tmp_path / "local"
    chute.cli.main(
        [
            "convert",
            str(data / "text.jsonl"),
            str(out),
            "--shards",
            "3",
            "--seed",
            "7",
            "--map",
            "beam_helpers:PREPROCESS",
            "--no-progress",
        ]
    )

    def shards(d: Path) -> dict[str, list[bytes]]:
        return {p.name: records_of(RecordFileDataSource(str(p))) for p in d.glob("part-*")}

    # Shard by shard: each holds what its positions give after the Filter, in both runners.
    assert shards(out) == shards(preprocessed) and len(shards(out)) == 3


def test_tokenize_with_the_real_bert_tokenizer(
    corpus_path: Path, shared_data_or_skip: Path, tmp_path: Path
) -> None:
    tokenize = [
        beam_helpers.BertTokenize(str(shared_data_or_skip / "bert-base-uncased.tokenizer.json")),
        beam_helpers.ToBytes(),
    ]
    out = tmp_path / "bert"
    beam_convert([corpus_path], out, shards=2, transforms=tokenize, records_per_range=1000)
    converted = [np.frombuffer(r, np.int32) for r in records_of(RecordFileDataSource(str(out)))]
    online = chute.MapDataset.source(chute.sources.JsonlDataSource(str(corpus_path)))
    online = online.map(tokenize[0])
    assert len(converted) == len(online) == 3000
    for i in (0, 1, 1499, 2999):
        np.testing.assert_array_equal(converted[i], online[i])
    assert all(len(c) > 0 for c in converted[:100])


# -- Parquet to .crec: identical to `chute convert`, byte-identical for any worker count ----


@pytest.fixture(scope="module")
def parquet_runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    base = tmp_path_factory.mktemp("parquet")
    runs = {}
    for workers in (1, 2):
        runs[workers] = base / f"w{workers}"
        beam_convert(
            [data / "rows.parquet"],
            runs[workers],
            shards=5,
            num_workers=workers,
            records_per_range=100 * workers + 37,
        )
    return runs


def test_parquet_to_crec_is_record_for_record_single_process_convert(
    data: Path, parquet_runs: dict[int, Path], tmp_path: Path
) -> None:
    chute.cli.main(
        ["convert", str(data / "rows.parquet"), str(tmp_path / "one.crec"), "--no-progress"]
    )
    expected = records_of(RecordFileDataSource(str(tmp_path / "one.crec")))
    assert len(expected) == 900
    assert records_of(RecordFileDataSource(str(parquet_runs[2]))) == expected
    assert json.loads(expected[3]) == {"i": 3, "text": "row 3 row 3 row 3 "}


def test_no_worker_process_outlives_its_job(parquet_runs: dict[int, Path]) -> None:
    import psutil

    alive = [p for p in psutil.Process().children(recursive=True) if p.is_running()]
    commands = [" ".join(p.cmdline()) for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert [c for c in commands if "apache_beam" in c] == []  # (other tests' forkservers stay)


def test_the_same_input_gives_the_same_shards_byte_for_byte(
    parquet_runs: dict[int, Path],
) -> None:
    one, two = shard_bytes(parquet_runs[1]), shard_bytes(parquet_runs[2])
    assert list(one) == ["manifest.json"] + [f"part-{k:05d}-of-00005.crec" for k in range(5)]
    assert one == two
    assert verify(str(parquet_runs[2])) == 900


# -- a job killed in the middle, then rerun --------------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "chute.cli", *args]


def test_a_killed_job_rerun_gives_a_complete_verified_dataset(tmp_path: Path) -> None:
    records = [b"record %06d " % i * (1 + i % 5) for i in range(2000)]
    src = write_tfrecord(tmp_path / "in.tfrecord", records)
    out = tmp_path / "out"
    cmd = _cli(
        "convert",
        str(src),
        str(out),
        "--shards",
        "32",
        "--runner",
        "beam",
        "--num-workers",
        "2",
        "--map",
        "beam_helpers:slow_copy",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    job = subprocess.Popen(
        cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 120
    try:
        while not list(out.glob("part-*.crec")):  # the first shard is committed: kill
            assert job.poll() is None, job.stderr.read().decode()[-2000:] if job.stderr else ""
            assert time.monotonic() < deadline, "no shard appeared in 120 s"
            time.sleep(0.005)
        os.killpg(job.pid, signal.SIGKILL)  # the job process and its Beam worker processes
    finally:
        job.wait()
        if job.stderr:
            job.stderr.close()
    assert job.returncode == -signal.SIGKILL
    committed = {p.name: p.stat().st_ino for p in out.glob("part-*.crec")}
    assert 0 < len(committed) < 32  # each shard is written (and fsynced) after the last read
    assert not (out / "manifest.json").exists()
    with pytest.raises(chute.DataError, match=r"no manifest.json"):
        RecordFileDataSource(str(out))
    kept_records = sum(len(RecordFileDataSource(str(out / n))) for n in committed)

    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"kept {kept_records:,} records" in done.stdout
    assert {n: (out / n).stat().st_ino for n in committed} == committed  # not rewritten
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"] + [
        f"part-{k:05d}-of-00032.crec" for k in range(32)
    ]
    assert verify(str(out)) == 2000
    assert records_of(RecordFileDataSource(str(out))) == records


# -- what the driver refuses before any worker starts (no Beam job runs) -------------------


def test_shard_positions_are_contiguous_balanced_ranges(tmp_path: Path) -> None:
    src = write_tfrecord(tmp_path / "in.tfrecord", [b"x"] * 10)
    for shards in (1, 3, 4, 10, 13):
        c = chute.beam.ConvertRecords([str(src)], str(tmp_path / f"o{shards}"), num_shards=shards)
        spec = c.spec
        bounds = [spec.bounds(k) for k in range(shards)]
        assert bounds[0][0] == 0 and bounds[-1][1] == 10
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
        for i in range(10):
            lo, hi = bounds[spec.shard_of(i)]
            assert lo <= i < hi


def test_output_directories_that_are_not_this_jobs_are_refused(tmp_path: Path) -> None:
    src = write_tfrecord(tmp_path / "in.tfrecord", [b"a", b"b", b"c"])
    other = write_tfrecord(tmp_path / "other.tfrecord", [b"d"])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(
        FileExistsError, match=r"holds files that are not shards of this conversion \(notes.txt\)"
    ):
        chute.beam.ConvertRecords([str(src)], str(mine), num_shards=2)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    out = tmp_path / "out"
    chute.beam.ConvertRecords([str(src)], str(out), num_shards=2)  # claims the directory
    assert (out / ".chute-job.json").exists()
    with pytest.raises(
        FileExistsError, match=r"an unfinished conversion with other inputs or options"
    ):
        chute.beam.ConvertRecords([str(other)], str(out), num_shards=2)
    with pytest.raises(FileExistsError, match=r"unfinished conversion"):
        chute.beam.ConvertRecords([str(src)], str(out), num_shards=3)
    chute.beam.ConvertRecords([str(src)], str(out), num_shards=2)  # the same job: a rerun
    (out / "part-00001-of-00002.crec").write_bytes(b"not a shard")
    with pytest.raises(
        FileExistsError,
        match=r"part-00001-of-00002.crec exists and is not a complete shard of this job",
    ):
        chute.beam.ConvertRecords([str(src)], str(out), num_shards=2)
    assert (out / "part-00001-of-00002.crec").read_bytes() == b"not a shard"


def test_bad_arguments_name_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_tfrecord(tmp_path / "in.tfrecord", [b"a"])
    with pytest.raises(TypeError, match=r"only element-wise transformations apply"):
        chute.beam.ReadRecords([str(src)], transforms=[chute.transforms.Batch(2)])
    with pytest.raises(
        TypeError, match=r"returned str, not bytes.*end them with a Map that encodes"
    ):
        chute.beam.ReadRecords([str(src)], transforms=[lambda r: r.decode()]).job.open().records(
            0, 1
        ).__next__()
    with pytest.raises(ValueError, match=r"random_map has no seed.*ds.seed\(42\)"):
        chute.beam.ReadRecords([str(src)], transforms=[beam_helpers.Crop()])
    assert (
        chute.cli.main(["convert", str(src), str(tmp_path / "o"), "--", "--runner=DataflowRunner"])
        == 1
    )
    assert "are Beam pipeline options: add --runner beam" in capsys.readouterr().err
    assert (
        chute.cli.main(["convert", str(src), str(tmp_path / "o"), "--runner", "beam", "--resume"])
        == 1
    )
    assert "a rerun of the same job finishes it" in capsys.readouterr().err
    assert chute.cli.main(["convert", str(src), str(tmp_path / "o"), "--map", "nocolon"]) == 1
    assert "give MODULE:NAME" in capsys.readouterr().err


def test_importing_chute_does_not_import_beam() -> None:
    code = "import sys, chute, chute.records, chute.cli; assert 'apache_beam' not in sys.modules"
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_read_records_reads_array_record_crec_and_numpy(
    seed001: tuple[Path, Any], parquet_runs: dict[int, Path], tmp_path: Path
) -> None:
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    rows = np.arange(60, dtype=np.int16).reshape(20, 3)
    np.save(tmp_path / "rows.npy", rows)
    inputs = {
        "arrayrecord": (str(seed001[0]), records_of(ArrayRecordDataSource(str(seed001[0])))),
        "crec": (str(parquet_runs[2]), records_of(RecordFileDataSource(str(parquet_runs[2])))),
        "numpy": (str(tmp_path / "rows.npy"), [r.tobytes() for r in rows]),
    }
    with beam.Pipeline(options=chute.beam.pipeline_options(num_workers=2)) as pipeline:
        for name, (path, expected) in inputs.items():
            read = chute.beam.ReadRecords(path, records_per_range=97)
            assert read.num_positions == len(expected)
            pairs = pipeline | f"Read{name}" >> read
            assert_that(pairs, equal_to(list(enumerate(expected))), label=f"Check{name}")


def test_options_after_the_double_dash_go_to_beam(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    opts = chute.beam.pipeline_options(2, ["--direct_num_workers=1", "--runner=FlinkRunner"])
    assert opts.view_as(DirectOptions).direct_num_workers == 1  # the user's options win
    assert opts.view_as(DirectOptions).direct_running_mode == "multi_processing"
    assert opts.view_as(StandardOptions).runner == "FlinkRunner"
    src = write_tfrecord(tmp_path / "in.tfrecord", [b"a"])
    argv = [
        "convert",
        str(src),
        str(tmp_path / "o"),
        "--runner",
        "beam",
        "--",
        "--runner=NoSuchRunner",
    ]
    assert chute.cli.main(argv) == 1
    assert "NoSuchRunner" in capsys.readouterr().err
