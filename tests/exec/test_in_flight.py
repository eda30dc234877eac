"""`reads_in_flight`: what a latency-bound source declares, found under a pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chute
from chute import sources
from chute._src.core import in_flight
from chute._src.exec.executors import reads_in_flight
from chute.records import RecordWriter
from remote_helpers import RangeServer


class _Remote:
    def __init__(self, n: Any) -> None:
        self.reads_in_flight = n

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        return i


def test_declared_value_found_under_the_stages() -> None:
    ds = (
        chute.MapDataset.source(_Remote(64))
        .shuffle(seed=1)
        .map(lambda x: x + 1)
        .filter(lambda x: x % 2 == 0)
    )
    assert reads_in_flight(ds) == 64


def test_largest_of_several_sources_and_none_is_zero() -> None:
    a, b = chute.MapDataset.source(_Remote(8)), chute.MapDataset.source(_Remote(300))
    mixed = chute.MapDataset.mix([a, b])
    assert reads_in_flight(mixed) == 300
    assert reads_in_flight(chute.MapDataset.source(list(range(5)))) == 0
    assert reads_in_flight(chute.MapDataset.range(5)) == 0
    assert reads_in_flight(chute.MapDataset.source(_Remote(10**9))) == in_flight.MOST


@pytest.mark.parametrize("bad", [-1, 2.5, "many", True])
def test_bad_declaration_names_the_source_and_the_rule(bad: Any) -> None:
    ds = chute.MapDataset.source(_Remote(bad)).shuffle(seed=1)
    with pytest.raises(
        ValueError, match=r"_Remote\.reads_in_flight is .*must be an int, 0 or more"
    ):
        reads_in_flight(ds)


def test_chute_sources_declare_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "served" / "b"
    d.mkdir(parents=True)
    with RecordWriter(d / "a.crec") as w:
        w.write(b"x")
    (d / "a.jsonl").write_text('{"a": 1}\n')
    from array_record.python import array_record_module

    aw = array_record_module.ArrayRecordWriter(str(d / "a.array_record"), "group_size:1")
    aw.write(b"x")
    aw.close()
    local: dict[str, Any] = {
        "crec": sources.RecordFileDataSource(str(d / "a.crec")),
        "jsonl": sources.JsonlDataSource(str(d / "a.jsonl")),
        "ar": sources.ArrayRecordDataSource(str(d / "a.array_record")),
    }
    assert {k: s.reads_in_flight for k, s in local.items()} == dict.fromkeys(local, 0)
    with RangeServer(str(tmp_path / "served")) as server:
        opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{server.port}"}}
        remote: dict[str, Any] = {
            "crec": sources.RecordFileDataSource("s3://b/a.crec", storage_options=opts),
            "jsonl": sources.JsonlDataSource("s3://b/a.jsonl", storage_options=opts),
            "ar": sources.ArrayRecordDataSource("s3://b/a.array_record", storage_options=opts),
        }
        want = dict.fromkeys(remote, in_flight.REMOTE_READS_IN_FLIGHT)
        assert {k: s.reads_in_flight for k, s in remote.items()} == want
        crec: sources.RecordFileDataSource = remote["crec"]
        ds = chute.MapDataset.source(crec).shuffle(seed=1)
        assert reads_in_flight(ds) == in_flight.REMOTE_READS_IN_FLIGHT
        assert list(ds) == [b"x"]


@pytest.mark.parametrize(("declared", "first"), [(512, 512), (0, 128), (64, 128)])
def test_autotune_starts_with_the_reads_a_source_declares(declared: int, first: int) -> None:
    ds = chute.MapDataset.source(_Remote(declared)).to_iter_dataset()
    with iter(ds) as it:
        assert next(it) == 0
        tuning = it.tuning()  # the reader's: what AUTOTUNE chose, and why
        assert tuning is not None
        start = next(d for d in tuning.decisions if d.setting == "prefetch_buffer_size")
        assert start.value == first
        assert ("reads in flight declared" in start.reason) == (declared > 128)
        assert list(it) == list(range(1, 10))  # the output is the source's, in order
