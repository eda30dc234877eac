"""One shard layout for both runners: `chute convert` and `chute convert --runner beam`
write the same `part-00003-of-00016` files holding the same records, and report the same
bytes in (the size of the files read). Datasets written with the earlier names
(`part-00000.crec`, listed by their manifest) still open and are replaced cleanly.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from chute.cli import main
from chute.records import ShardedRecordWriter
from chute.sources import ArrayRecordDataSource, RecordFileDataSource


def records_of(source: object) -> list[bytes]:
    return [bytes(source[i]) for i in range(len(source))]  # type: ignore[index, arg-type]


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    text = ["chute beam shard"[: 6 * (i % 4)] for i in range(50)]  # every 4th one empty
    path.write_text("".join(json.dumps({"i": i, "text": text[i]}) + "\n" for i in range(50)))
    return path


def shard_counts(out: Path, suffix: str) -> dict[str, int]:
    opener = RecordFileDataSource if suffix == ".crec" else ArrayRecordDataSource
    return {p.name: len(opener(str(p))) for p in sorted(out.glob(f"part-*{suffix}"))}


@pytest.mark.parametrize(("to", "suffix"), [("crec", ".crec"), ("arrayrecord", ".array_record")])
def test_local_convert_writes_exactly_the_shards_it_names(
    tmp_path: Path, jsonl: Path, to: str, suffix: str
) -> None:
    for shards, n in ((4, 50), (4, 2), (3, 0)):
        out = tmp_path / f"{to}{shards}-{n}"
        src = jsonl if n == 50 else tmp_path / f"in{n}.jsonl"
        if n != 50:
            src.write_text("".join(f'{{"i": {i}}}\n' for i in range(n)))
        argv = ["convert", str(src), str(out), "--shards", str(shards), "--to", to]
        assert main([*argv, "--no-progress"]) == 0
        counts = shard_counts(out, suffix)
        names = [f"part-{k:05d}-of-{shards:05d}{suffix}" for k in range(shards)]
        assert list(counts) == names
        # Shard k holds positions [k*n//S, (k+1)*n//S), as chute.beam lays them out.
        assert list(counts.values()) == [
            (k + 1) * n // shards - k * n // shards for k in range(shards)
        ]


def test_a_dataset_with_the_earlier_names_opens_and_is_replaced(
    tmp_path: Path, jsonl: Path
) -> None:
    ds = tmp_path / "ds"
    with ShardedRecordWriter(ds, records_per_shard=20) as w:  # part-00000.crec, ...
        for i in range(50):
            w.write(b"old %d" % i)
    old = sorted(p.name for p in ds.glob("*.crec"))
    assert old == ["part-00000.crec", "part-00001.crec", "part-00002.crec"]
    assert records_of(RecordFileDataSource(str(ds)))[49] == b"old 49"
    assert (
        main(["convert", str(jsonl), str(ds), "--shards", "2", "--overwrite", "--no-progress"]) == 0
    )
    assert sorted(os.listdir(ds)) == [
        "manifest.json",
        "part-00000-of-00002.crec",
        "part-00001-of-00002.crec",
    ]
    assert json.loads(records_of(RecordFileDataSource(str(ds)))[49])["i"] == 49


def test_a_fixed_layout_refuses_records_past_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"num_records=5 lays out num_shards shards"):
        ShardedRecordWriter(tmp_path / "a", num_records=5)
    w = ShardedRecordWriter(tmp_path / "b", num_shards=2, num_records=3)
    for i in range(3):
        w.write(b"%d" % i)
    with pytest.raises(ValueError, match=r"a write past the 2 shards of num_shards=2.*holds 3"):
        w.write(b"one too many")
    w.abort()
    assert os.listdir(tmp_path / "b") == []


@pytest.mark.slow  # > 7 s on 2 cores: in .ci/run, not in a plain pytest run
def test_both_runners_write_the_same_shards_and_count_the_same_bytes(
    tmp_path: Path,
    jsonl: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("apache_beam", reason="chute.beam needs the [beam] extra")
    # Beam's worker processes import beam_helpers (its Filter drops the empty texts).
    tests = str(Path(__file__).resolve().parents[1])
    monkeypatch.syspath_prepend(tests)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    )
    preprocess = ["--map", "beam_helpers:PREPROCESS", "--seed", "7"]
    cases = [
        ("crec", ".crec", []),
        ("arrayrecord", ".array_record", []),
        ("crec", ".crec", preprocess),
    ]
    for to, suffix, maps in cases:
        shards: dict[str, dict[str, list[bytes]]] = {}
        reports = {}
        for runner in ("local", "beam"):
            out = tmp_path / f"{runner}-{to}-{len(maps)}"
            argv = ["convert", str(jsonl), str(out), "--shards", "3", "--to", to, *maps]
            argv.append("--no-progress")
            if runner == "beam":
                argv += ["--runner", "beam", "--num-workers", "1"]
            assert main(argv) == 0
            reports[runner] = re.findall(r"([\d,]+) bytes in", capsys.readouterr().out)
            opener = RecordFileDataSource if to == "crec" else ArrayRecordDataSource
            shards[runner] = {
                p.name: records_of(opener(str(p))) for p in sorted(out.glob(f"part-*{suffix}"))
            }
        size = jsonl.stat().st_size
        assert reports == {"local": [f"{size:,}"], "beam": [f"{size:,}"]}
        assert list(shards["local"]) == [f"part-{k:05d}-of-00003{suffix}" for k in range(3)]
        assert shards["local"] == shards["beam"]
        if maps:  # shard k holds what positions [k*n//S, (k+1)*n//S) give after the Filter
            assert [len(r) for r in shards["local"].values()] == [12, 12, 13]
