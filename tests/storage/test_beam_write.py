"""`chute.beam.WriteShards` over a plain PCollection of records (as `WriteToArrayRecord`
takes), and over `(position, record)` pairs, on Beam's real DirectRunner.

Most jobs run in-process (Beam's fastest mode, about a second each); the determinism
check also runs with 2 worker processes.
"""

from __future__ import annotations

import json
import random
import typing
from pathlib import Path

import pytest

pytest.importorskip("apache_beam", reason="chute.beam needs the [beam] extra")

import apache_beam as beam

import chute.beam
from chute.sources import ArrayRecordDataSource, RecordFileDataSource

RECORDS = [b"record %05d " % i * (1 + i % 7) for i in range(1000)]


def write(records: list[bytes], out: Path, workers: int = 0, **kw: object) -> None:
    options = chute.beam.pipeline_options(workers) if workers else None
    with beam.Pipeline(options=options) as p:
        _ = p | beam.Create(records) | chute.beam.WriteShards(str(out), **kw)  # type: ignore[arg-type]


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_plain_pcollection_gives_the_same_shards_whatever_the_order_and_workers(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    write(RECORDS, out, num_shards=4)
    a = files(out)
    out.rename(tmp_path / "first")
    shuffled = RECORDS[:]
    random.Random(1).shuffle(shuffled)
    write(shuffled, out, workers=2, num_shards=4)  # the same job (its id names the output)
    assert list(a) == ["manifest.json"] + [f"part-{k:05d}-of-00004.crec" for k in range(4)]
    assert a == files(out)  # byte for byte, the manifest too
    source = RecordFileDataSource(str(out))
    got = [source[i] for i in range(len(source))]
    assert sorted(got) == sorted(RECORDS)  # every record once
    counts = [s["num_records"] for s in json.loads(a["manifest.json"])["shards"]]
    assert sum(counts) == 1000 and min(counts) > 200  # spread by the hash


def test_array_record_shards_from_a_plain_pcollection(tmp_path: Path) -> None:
    write(RECORDS[:300], tmp_path / "ar", num_shards=3, format="arrayrecord")
    names = sorted(p.name for p in (tmp_path / "ar").iterdir())
    assert names == ["manifest.json"] + [f"part-{k:05d}-of-00003.array_record" for k in range(3)]
    source = ArrayRecordDataSource(str(tmp_path / "ar"))
    assert sorted(source[i] for i in range(len(source))) == sorted(RECORDS[:300])


def test_positioned_pairs_keep_the_input_order(tmp_path: Path) -> None:
    pairs = list(enumerate(RECORDS[:100]))
    random.Random(2).shuffle(pairs)
    write(pairs, tmp_path / "pos", num_shards=3, num_positions=100)  # type: ignore[arg-type]
    shards = [
        RecordFileDataSource(str(tmp_path / "pos" / f"part-{k:05d}-of-00003.crec"))
        for k in range(3)
    ]
    assert [len(s) for s in shards] == [33, 33, 34]  # [k*n//S, (k+1)*n//S)
    source = RecordFileDataSource(str(tmp_path / "pos"))
    assert [source[i] for i in range(100)] == RECORDS[:100]


def test_fewer_records_than_shards_gives_empty_shards(tmp_path: Path) -> None:
    write([b"one"], tmp_path / "few", num_shards=3)
    assert len(list((tmp_path / "few").glob("part-*-of-00003.crec"))) == 3
    assert RecordFileDataSource(str(tmp_path / "few"))[0] == b"one"


def write_untyped(records: list[object], out: Path, **kw: object) -> None:
    """`write` with elements whose type Beam does not know (`Any`), so no check of
    Beam's or chute's can refuse them when the pipeline is built."""
    with beam.Pipeline() as p:
        _ = (
            p
            | beam.Create(records).with_output_types(typing.Any)
            | chute.beam.WriteShards(str(out), **kw)  # type: ignore[arg-type]
        )


# What a user who gave the wrong elements needs to read, whichever check finds them (the
# one when the pipeline is built, or the one per element while it runs), in words that are
# chute's own and not one Beam release's: what WriteShards takes, what it got, the fix.
NOT_BYTES = r"(?is)takes records as bytes.*got.*tuple.*give num_positions="
NOT_ENCODED = r"(?is)takes records as bytes.*got.*str.*encode each element to bytes"
NOT_PAIRS = r"(?is)takes \(position, record\) pairs.*got.*bytes.*leave num_positions out"


@pytest.mark.parametrize("writer", [write, write_untyped], ids=["typed", "untyped"])
def test_elements_that_are_not_records_name_the_fix(writer: typing.Any, tmp_path: Path) -> None:
    with pytest.raises(Exception, match=NOT_BYTES):
        writer([(0, b"a")], tmp_path / "t", num_shards=2)
    with pytest.raises(Exception, match=NOT_ENCODED):
        writer(["a"], tmp_path / "s", num_shards=2)
    with pytest.raises(Exception, match=NOT_PAIRS):
        writer([b"a"], tmp_path / "p", num_shards=2, num_positions=1)


def test_a_typed_pcollection_is_refused_when_the_pipeline_is_built(tmp_path: Path) -> None:
    p = beam.Pipeline()
    pairs = p | beam.Create([(0, b"a")])
    with pytest.raises(TypeError, match=NOT_BYTES) as raised:
        _ = pairs | chute.beam.WriteShards(str(tmp_path / "t"), num_shards=2)
    assert "Tuple[int, bytes]" in str(raised.value)  # the type as Beam inferred it, readable
    texts = p | "Texts" >> beam.Create(["a"])
    with pytest.raises(TypeError, match=NOT_ENCODED):
        _ = texts | "W2" >> chute.beam.WriteShards(str(tmp_path / "s"), num_shards=2)


def test_the_argument_checks_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"num_positions=-1 is invalid"):
        chute.beam.WriteShards(str(tmp_path / "n"), num_shards=2, num_positions=-1)
    with pytest.raises(ValueError, match=r"num_shards=0 is invalid; give 1 or more"):
        chute.beam.WriteShards(str(tmp_path / "z"), num_shards=0)
