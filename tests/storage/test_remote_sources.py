"""Every format read from object storage (a real S3 server on 127.0.0.1, and memory://),
record for record equal to the same files read locally; `chute convert` from and to the
bucket, then `chute verify` and `chute inspect` on it."""

from __future__ import annotations

import json
import os
import struct
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chute import sources
from chute.cli import main
from chute.records import RecordWriter

RECORDS = [f"record {i} ".encode() * (i % 7 + 1) for i in range(300)]
INDICES = [299, 0, 17, 150, 17, 42]


def _write_local(d: Path) -> None:
    from chute._src.storage.formats.tfrecord import masked_crc32c

    with open(d / "a.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"i": i}) + ("\r\n" if i % 3 else "\n"))
    with open(d / "a.tfrecord", "wb") as f:
        for r in RECORDS:
            h = struct.pack("<Q", len(r))
            f.write(h + struct.pack("<I", masked_crc32c(h)) + r)
            f.write(struct.pack("<I", masked_crc32c(r)))
    np.save(d / "a.npy", np.arange(900, dtype=np.int32).reshape(300, 3))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"i": list(range(300))}), d / "a.parquet", row_group_size=50)
    from array_record.python import array_record_module

    w = array_record_module.ArrayRecordWriter(str(d / "a.array_record"), "group_size:1")
    for r in RECORDS:
        w.write(r)
    w.close()
    with RecordWriter(d / "a.crec", compression="zstd") as cw:
        for r in RECORDS:
            cw.write(r)


def _place(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, dict[str, Any], Callable[[Path, str], None]]]:
    """(URL prefix, storage options, upload(local file, name)) of an empty place in a
    store: fsspec's memory://, moto's S3 server, or a plain HTTP server (`RangeServer`
    serving a folder, with folder listings) on 127.0.0.1."""
    if kind == "memory":
        import fsspec

        fs = fsspec.filesystem("memory")
        prefix = f"memory://chute-{uuid.uuid4().hex[:8]}"
        yield prefix, {}, lambda p, name: fs.put_file(str(p), f"{prefix}/{name}")
        fs.rm(prefix, recursive=True)
        return
    if kind == "http":
        import shutil

        from remote_helpers import RangeServer

        root = tmp_path / "served"
        (root / "d").mkdir(parents=True)

        def put(p: Path, name: str) -> None:
            (root / "d" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, root / "d" / name)

        with RangeServer(str(root), listings=True) as server:
            yield f"http://127.0.0.1:{server.port}/d", {}, put
        return
    server = request.getfixturevalue("s3_server")
    prefix = server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    fs = server.fs()
    yield prefix, server.options, lambda p, name: fs.put_file(str(p), f"{prefix}/{name}")


@pytest.fixture(params=["memory", "s3"])
def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, Any], Callable[[Path, str], None]]]:
    """A writable place (memory://, moto's S3)."""
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path / "cache"))
    yield from _place(request.param, request, tmp_path)


@pytest.fixture(params=["memory", "s3", "http"])
def readable_store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, dict[str, Any], Callable[[Path, str], None]]]:
    """A place to read from: the writable ones and a plain HTTP server."""
    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path / "cache"))
    yield from _place(request.param, request, tmp_path)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


@pytest.mark.parametrize(
    "cls,name",
    [
        (sources.RecordFileDataSource, "a.crec"),
        (sources.JsonlDataSource, "a.jsonl"),
        (sources.TFRecordDataSource, "a.tfrecord"),
        (sources.NumpyDataSource, "a.npy"),
        (sources.ParquetDataSource, "a.parquet"),
        (sources.ArrayRecordDataSource, "a.array_record"),
    ],
)
def test_every_format_reads_from_the_store(
    readable_store: Any, tmp_path: Path, cls: Any, name: str
) -> None:
    prefix, options, upload = readable_store
    _write_local(tmp_path)
    upload(tmp_path / name, name)
    local = cls(str(tmp_path / name))
    remote = cls(f"{prefix}/{name}", storage_options=options)
    assert len(remote) == len(local) == 300
    assert all(
        _same(a, b) for a, b in zip(remote.__getitems__(INDICES), local.__getitems__(INDICES))
    )
    assert all(_same(remote[i], local[i]) for i in (0, 5, 299))
    # A glob over the bucket expands sorted, like a local one.
    again = cls(f"{prefix}/a*{os.path.splitext(name)[1]}", storage_options=options)
    assert len(again) == 300
    # Pickled (as to a worker process), it reopens the object with the same options.
    import pickle

    copy = pickle.loads(pickle.dumps(remote))
    assert _same(copy[7], local[7])


@pytest.mark.parametrize(
    "cls,name",
    [(sources.RecordFileDataSource, "a.crec"), (sources.ArrayRecordDataSource, "a.array_record")],
)
def test_dataset_directories_and_globs_open_as_locally(
    readable_store: Any,
    tmp_path: Path,
    cls: Any,
    name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A directory of shards with a manifest (`chute.records.write_manifest`) opens by
    its URL as a local one opens by its path; a glob over its shards reads the same."""
    from chute.records import write_manifest

    prefix, options, upload = readable_store
    _write_local(tmp_path)
    local_dir = tmp_path / "ds"
    local_dir.mkdir()
    ext = os.path.splitext(name)[1]
    for k in range(3):  # three shards, each a copy of the file
        (local_dir / f"part-{k}{ext}").write_bytes((tmp_path / name).read_bytes())
    write_manifest(local_dir)
    for f in sorted(local_dir.iterdir()):
        upload(f, f"ds/{f.name}")
    local = cls(str(local_dir))
    for url in (f"{prefix}/ds", f"{prefix}/ds/", f"{prefix}/ds/*{ext}"):
        remote = cls(url, storage_options=options)
        assert len(remote) == len(local) == 900, url
        picks = [0, 299, 300, 899, 451]
        assert all(
            _same(a, b) for a, b in zip(remote.__getitems__(picks), local.__getitems__(picks))
        )


def test_file_scheme_is_the_local_path(tmp_path: Path) -> None:
    _write_local(tmp_path)
    src = sources.RecordFileDataSource(f"file://{tmp_path}/a.crec")
    assert src[3] == RECORDS[3]
    assert src.paths == [f"{tmp_path}/a.crec"]


def test_file_objects_are_refused_with_the_fix(tmp_path: Path) -> None:
    _write_local(tmp_path)
    with (
        open(tmp_path / "a.crec", "rb") as f,
        pytest.raises(TypeError, match=r"file object.*pass the path or URL"),
    ):
        sources.RecordFileDataSource(f)  # type: ignore[arg-type]


def test_convert_verify_inspect_from_and_to_the_store(
    store: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix, options, upload = store
    _write_local(tmp_path)
    upload(tmp_path / "a.jsonl", "in/a.jsonl")
    so = ["--storage-options", json.dumps(options)] if options else []
    out = f"{prefix}/ds"
    assert (
        main(["convert", f"{prefix}/in/*.jsonl", out, "--shards", "3", "--no-progress", *so]) == 0
    )
    assert main(["verify", out, "--no-progress", *so]) == 0
    assert "OK: 300 records" in capsys.readouterr().out
    assert main(["inspect", out, *so]) == 0
    text = capsys.readouterr().out
    assert "files:    3" in text and "records:  300" in text
    ds = sources.RecordFileDataSource(out, storage_options=options)
    assert json.loads(ds[299]) == {"i": 299}
    # A second conversion to the same place needs --overwrite.
    assert main(["convert", f"{prefix}/in/a.jsonl", out, "--shards", "3", *so]) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err
    # From the bucket back to a local single file, and to a single remote file.
    assert main(["convert", out, str(tmp_path / "back.crec"), "--no-progress", *so]) == 0
    assert sources.RecordFileDataSource(str(tmp_path / "back.crec"))[5] == ds[5]
    single = f"{prefix}/one.crec"
    assert main(["convert", f"{prefix}/in/a.jsonl", single, "--no-progress", *so]) == 0
    assert main(["verify", single, "--no-progress", *so]) == 0


@pytest.mark.parametrize(
    "name", ["a.crec", "a.tfrecord", "a.npy", "a.parquet", "a.array_record", "a.jsonl"]
)
def test_every_format_converts_from_the_store_and_to_it(
    store: Any, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix, options, upload = store
    _write_local(tmp_path)
    upload(tmp_path / name, f"in/{name}")
    so = ["--storage-options", json.dumps(options)] if options else []
    out = f"{prefix}/out-{name}.crec"
    assert main(["convert", f"{prefix}/in/{name}", out, "--no-progress", *so]) == 0
    assert main(["verify", out, "--no-progress", *so]) == 0
    assert "OK: 300 records" in capsys.readouterr().out
    # The same conversion from the local file gives the same records.
    local = tmp_path / f"{name}.crec"
    assert main(["convert", str(tmp_path / name), str(local), "--no-progress"]) == 0
    a = sources.RecordFileDataSource(out, storage_options=options)
    b = sources.RecordFileDataSource(str(local))
    assert a.__getitems__(list(range(300))) == b.__getitems__(list(range(300)))
    # And to ArrayRecord in the bucket, verified there.
    ar = f"{prefix}/out-{name}.array_record"
    assert main(["convert", f"{prefix}/in/{name}", ar, "--no-progress", *so]) == 0
    assert main(["verify", ar, "--no-progress", *so]) == 0


def test_record_writer_uploads_whole_on_close(store: Any) -> None:
    prefix, options, _ = store
    url = f"{prefix}/w.crec"
    with RecordWriter(url, storage_options=options) as w:
        for r in RECORDS[:10]:
            w.write(r)
        with pytest.raises(FileNotFoundError):  # nothing there until it closes
            sources.RecordFileDataSource(url, storage_options=options)
    assert sources.RecordFileDataSource(url, storage_options=options)[9] == RECORDS[9]


def test_file_streams_read_urls(store: Any, tmp_path: Path) -> None:
    import chute

    prefix, options, upload = store
    _write_local(tmp_path)
    upload(tmp_path / "a.jsonl", "s/a.jsonl")
    ds = chute.experimental.JsonlIterDataset(f"{prefix}/s/*.jsonl", storage_options=options)
    it = iter(ds)
    assert [next(it)["i"] for _ in range(5)] == [0, 1, 2, 3, 4]
    state = it.get_state()
    rest = [x["i"] for x in it]
    it2 = iter(ds)
    it2.set_state(state)
    assert [x["i"] for x in it2] == rest == list(range(5, 300))


def test_cache_in_the_store(store: Any) -> None:
    import chute

    prefix, options, _ = store
    calls: list[int] = []

    def slow(x: int) -> int:
        calls.append(x)
        return x * 3

    ds = chute.MapDataset.range(50).to_iter_dataset().map(slow)
    cached = ds.cache(f"{prefix}/cache", storage_options=options)
    assert list(cached) == [3 * i for i in range(50)]  # computed, uploaded at the end
    assert len(calls) == 50
    again = ds.cache(f"{prefix}/cache", storage_options=options)
    it = iter(again)
    assert [next(it) for _ in range(10)] == [3 * i for i in range(10)]
    state = it.get_state()
    assert len(calls) == 50  # read from the bucket, not computed
    it2 = iter(again)
    it2.set_state(state)
    assert list(it2) == [3 * i for i in range(10, 50)]
    assert cached.location.startswith(f"{prefix}/cache/")  # type: ignore[attr-defined]


def test_many_urls_are_checked_concurrently_and_kept_in_order(tmp_path: Path) -> None:
    """Each URL of a list is looked up (a round trip each) on a thread pool; the list
    keeps the order given, globs and local paths mixed in, and the first missing URL in
    that order is the one named."""
    import uuid

    import fsspec

    from chute._src.storage.formats._paths import MissingFileError, expand_paths

    fs = fsspec.filesystem("memory")
    prefix = f"memory://chute-{uuid.uuid4().hex[:8]}"
    names = [f"f{k:02d}.jsonl" for k in range(12)]
    for name in names:
        fs.pipe(f"{prefix}/{name}", b'{"a": 1}\n')
    local = tmp_path / "x.jsonl"
    local.write_text('{"a": 2}\n')
    urls = [f"{prefix}/{n}" for n in reversed(names)]
    got = expand_paths([*urls[:6], str(local), f"{prefix}/f0[0-2].jsonl", *urls[6:]], "t")
    globbed = [f"f0{k}.jsonl" for k in range(3)]  # as the store names them
    assert got[:7] == [*urls[:6], str(local)] and got[10:] == urls[6:]
    assert [u.rsplit("/", 1)[-1] for u in got[7:10]] == globbed
    with pytest.raises(MissingFileError, match=r"t: .*/missing-1"):
        expand_paths([*urls, f"{prefix}/missing-1", f"{prefix}/missing-2"], "t")


@pytest.mark.parametrize("options", ["group_size:1,uncompressed", "group_size:1,zstd:3"])
def test_array_record_blocks_of_reads_match_local_records_that_cross_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: str
) -> None:
    """`__getitems__` on remote ArrayRecord files fetches every record's bytes at once,
    then decodes each: records that straddle the format's 64 KiB blocks (their bytes
    interleaved with block headers), compressed or not, and a list that mixes local and
    remote files all read as locally."""
    import fsspec
    from array_record.python import array_record_module

    monkeypatch.setenv("CHUTE_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(5)
    records = [rng.bytes(int(n)) for n in rng.integers(1, 150_000, 60)]
    path = tmp_path / "big.array_record"
    w = array_record_module.ArrayRecordWriter(str(path), options)
    for r in records:
        w.write(r)
    w.close()
    prefix = f"memory://chute-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    fs.put_file(str(path), f"{prefix}/big.array_record")
    try:
        remote = sources.ArrayRecordDataSource(f"{prefix}/big.array_record")
        indices = [int(i) for i in rng.permutation(60)]
        assert remote.__getitems__(indices) == [records[i] for i in indices]
        mixed = sources.ArrayRecordDataSource([str(path), f"{prefix}/big.array_record"])
        both = [*indices[:20], *(60 + i for i in indices[:20])]
        assert mixed.__getitems__(both) == [records[i % 60] for i in both]
    finally:
        fs.rm(prefix, recursive=True)
