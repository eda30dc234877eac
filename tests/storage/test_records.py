"""The .crec format through chute.records and chute.sources.RecordFileDataSource."""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chute import DataError
from chute.records import RecordWriter, ShardedRecordWriter, verify
from chute.sources import RecordFileDataSource

RECORDS = [b"", b"a", b"hello world" * 3, bytes(range(256)) * 5, b"x" * 1000, b"tail"]
TRAILER_SIZE = 88


def _write(path: Path, records: list[bytes], **kw: object) -> Path:
    with RecordWriter(path, **kw) as w:  # type: ignore[arg-type]
        for r in records:
            w.write(r)
    return path


def _text_records(n: int) -> list[bytes]:
    words = b"the quick brown fox jumps over the lazy dog and keeps running".split()
    return [b" ".join(words[(i * 7 + j) % len(words)] for j in range(5 + i % 40)) for i in range(n)]


@pytest.mark.parametrize(
    "options",
    [{}, {"compression": "zstd"}, {"compression": "zstd", "train_dictionary": True}],
    ids=["raw", "zstd", "zstd-dict"],
)
def test_roundtrip(tmp_path: Path, options: dict[str, object]) -> None:
    records = RECORDS + _text_records(300)
    src = RecordFileDataSource(_write(tmp_path / "d.crec", records, **options))
    assert len(src) == len(records)
    assert [src[i] for i in range(len(src))] == records
    assert src.__getitems__(list(range(len(records)))[::-1]) == records[::-1]
    assert src[-1] == records[-1]
    assert verify(tmp_path / "d.crec") == len(records)


def test_compression_saves_space_and_keeps_incompressible_records_raw(tmp_path: Path) -> None:
    text = _text_records(2000)
    raw = _write(tmp_path / "raw.crec", text).stat().st_size
    zstd = _write(tmp_path / "z.crec", text, compression="zstd").stat().st_size
    dic = _write(tmp_path / "zd.crec", text, compression="zstd", train_dictionary=True)
    assert dic.stat().st_size < zstd < raw
    noise = [os.urandom(500) for _ in range(20)]
    a = _write(tmp_path / "n.crec", noise).stat().st_size
    b = _write(tmp_path / "nz.crec", noise, compression="zstd").stat().st_size
    assert a == b


def test_empty_dataset_and_metadata(tmp_path: Path) -> None:
    src = RecordFileDataSource(_write(tmp_path / "e.crec", [], metadata={"kind": "empty"}))
    assert len(src) == 0
    assert src.metadata == {"kind": "empty"}
    with pytest.raises(IndexError, match="out of range"):
        src[0]


def test_views_are_aligned_and_zero_copy(tmp_path: Path) -> None:
    arrays = [np.arange(n, dtype=np.float64) for n in (1, 3, 17, 100)]
    path = _write(tmp_path / "a.crec", [a.tobytes() for a in arrays], alignment=64)
    src = RecordFileDataSource(path)
    for i, a in enumerate(arrays):
        view = np.frombuffer(src.view(i), dtype=np.float64)
        assert view.ctypes.data % 64 == 0
        np.testing.assert_array_equal(view, a)


def test_read_into_reuses_a_buffer(tmp_path: Path) -> None:
    records = RECORDS + _text_records(50)
    src = RecordFileDataSource(_write(tmp_path / "d.crec", records, compression="zstd"))
    indices = [5, 0, 3, 3, 40, 1]
    sizes = src.record_sizes(indices)
    assert list(sizes) == [len(records[i]) for i in indices]
    for buf in (bytearray(int(sizes.sum()) + 10), np.zeros(4096, dtype=np.uint8)):
        ends = src.read_into(indices, buf)
        # numpy's stubs give ndarray the buffer protocol for Python >= 3.12 only.
        view = memoryview(buf)  # type: ignore[arg-type]
        got = [bytes(view[ends[k] : ends[k + 1]]) for k in range(len(indices))]
        assert got == [records[i] for i in indices]
    with pytest.raises(ValueError, match="allocate at least"):
        src.read_into(indices, bytearray(3))
    with pytest.raises(ValueError, match="writable"):
        src.read_into(indices, bytes(10000))


def test_pickle_reopens_lazily(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.crec", RECORDS)
    src = RecordFileDataSource(path)
    fresh = pickle.loads(pickle.dumps(src))
    assert src[2] == RECORDS[2]
    used = pickle.loads(pickle.dumps(src))
    assert fresh[3] == used[3] == RECORDS[3]
    assert repr(used) == f"RecordFileDataSource({str(path)!r}, verify_checksums=True)"


def test_threads_read_the_same_records(tmp_path: Path) -> None:
    records = _text_records(2000)
    src = RecordFileDataSource(_write(tmp_path / "d.crec", records, compression="zstd"))
    barrier = threading.Barrier(4)

    def read(seed: int) -> bool:
        barrier.wait()
        order = np.random.default_rng(seed).permutation(len(records))
        return all(src[int(i)] == records[i] for i in order)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, range(4)))


def test_sharded_dataset(tmp_path: Path) -> None:
    records = _text_records(103)
    with ShardedRecordWriter(tmp_path / "ds", records_per_shard=25, compression="zstd") as w:
        for r in records:
            w.write(r)
    shards = sorted(p.name for p in (tmp_path / "ds").glob("*.crec"))
    assert shards == [f"part-{i:05d}.crec" for i in range(5)]
    for spec in (tmp_path / "ds", tmp_path / "ds" / "manifest.json"):
        src = RecordFileDataSource(spec)
        assert len(src) == 103
        assert [src[i] for i in range(103)] == records
        order = list(np.random.default_rng(0).permutation(103))
        assert src.__getitems__(order) == [records[i] for i in order]
    files = RecordFileDataSource(str(tmp_path / "ds" / "*.crec"))
    assert [files[i] for i in range(103)] == records
    listed = RecordFileDataSource([tmp_path / "ds" / "part-00004.crec", tmp_path / "ds"])
    assert len(listed) == 3 + 103 and listed[0] == records[100]


def test_missing_or_swapped_shard_names_the_file(tmp_path: Path) -> None:
    with ShardedRecordWriter(tmp_path / "ds", records_per_shard=2) as w:
        for r in RECORDS:
            w.write(r)
    (tmp_path / "ds" / "part-00001.crec").unlink()
    with pytest.raises(DataError, match=r"part-00001\.crec: no such file"):
        len(RecordFileDataSource(tmp_path / "ds"))
    _write(tmp_path / "ds" / "part-00001.crec", [b"x", b"y"])
    with pytest.raises(DataError, match=r"part-00001\.crec: the shard does not match"):
        len(RecordFileDataSource(tmp_path / "ds"))
    (tmp_path / "ds" / "manifest.json").unlink()
    with pytest.raises(DataError, match=r"no manifest\.json"):
        RecordFileDataSource(tmp_path / "ds")


def test_failed_write_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "d.crec"
    with pytest.raises(RuntimeError), RecordWriter(path) as w:
        w.write(b"partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_killed_writer_leaves_no_file_under_its_name(tmp_path: Path) -> None:
    code = (
        "import os, sys\n"
        "from chute.records import ShardedRecordWriter\n"
        "w = ShardedRecordWriter(sys.argv[1], records_per_shard=10)\n"
        "for i in range(25):\n"
        "    w.write(b'r%d' % i)\n"
        "os._exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ds")], check=False)
    assert proc.returncode == 3
    names = sorted(p.name for p in (tmp_path / "ds").iterdir())
    assert "manifest.json" not in names
    assert "part-00002.crec" not in names
    with pytest.raises(DataError, match="interrupted"):
        RecordFileDataSource(tmp_path / "ds")


# -- bad input ------------------------------------------------------------------------


def _corrupt(path: Path, pos: int, xor: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= xor
    path.write_bytes(bytes(data))


def _read_all(path: Path, **kw: Any) -> list[bytes]:
    src = RecordFileDataSource(path, **kw)
    return [src[i] for i in range(len(src))]


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "e.crec").write_bytes(b"")
    with pytest.raises(DataError, match=r"e\.crec: the file is empty"):
        _read_all(tmp_path / "e.crec")


def test_wrong_magic(tmp_path: Path) -> None:
    (tmp_path / "j.crec").write_bytes(b'{"not": "a crec file"}\n' * 20)
    with pytest.raises(DataError, match=r"j\.crec: bad magic .* not a chute record file"):
        _read_all(tmp_path / "j.crec")


@pytest.mark.parametrize("keep", [0.999, 0.5, 40])
def test_truncated_file(tmp_path: Path, keep: float) -> None:
    path = _write(tmp_path / "t.crec", RECORDS)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep) if keep < 1 else int(keep)])
    with pytest.raises(DataError, match=r"t\.crec: .*truncated"):
        _read_all(path)


def test_flipped_bit_in_payload_names_the_record(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.crec", RECORDS)
    pos = path.read_bytes().index(b"hello world")
    _corrupt(path, pos + 4)
    with pytest.raises(DataError, match=r"p\.crec: record 2: the payload fails its CRC32C"):
        _read_all(path)
    with pytest.raises(DataError, match="record 2"):
        verify(path)
    unchecked = _read_all(path, verify_checksums=False)
    assert unchecked[3] == RECORDS[3] and unchecked[2] != RECORDS[2]


def test_flipped_bit_in_compressed_payload(tmp_path: Path) -> None:
    records = _text_records(100)
    path = _write(tmp_path / "z.crec", records, compression="zstd")
    _corrupt(path, 200, 0x40)
    with pytest.raises(DataError, match=r"z\.crec: record \d+: the payload fails"):
        _read_all(path)


def test_flipped_bit_in_index_or_trailer(tmp_path: Path) -> None:
    path = _write(tmp_path / "i.crec", RECORDS)
    size = path.stat().st_size
    _corrupt(path, size - TRAILER_SIZE - 30)
    with pytest.raises(DataError, match=r"i\.crec: the index fails its CRC32C check"):
        _read_all(path)
    path = _write(tmp_path / "t.crec", RECORDS)
    _corrupt(path, size - TRAILER_SIZE + 20)
    with pytest.raises(DataError, match=r"t\.crec: the trailer fails its CRC32C check"):
        _read_all(path)
    path = _write(tmp_path / "h.crec", RECORDS)
    _corrupt(path, 13)
    with pytest.raises(DataError, match=r"h\.crec: the header fails its CRC32C check"):
        _read_all(path)


def test_index_pointing_outside_the_file(tmp_path: Path) -> None:
    """A well-checksummed index whose entry leaves the payload region is still refused."""
    import crc32c

    path = _write(tmp_path / "o.crec", RECORDS)
    data = bytearray(path.read_bytes())
    tpos = len(data) - TRAILER_SIZE
    n, _, index_offset = struct.unpack_from("<QQQ", data, tpos + 16)
    struct.pack_into("<Q", data, index_offset + 8 * 3, 10**12)
    index = bytes(data[index_offset : index_offset + 21 * n])
    struct.pack_into("<I", data, tpos + 72, crc32c.crc32c(index))
    struct.pack_into("<I", data, tpos + 84, crc32c.crc32c(bytes(data[tpos : tpos + 84])))
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"o\.crec: record 3: the index points outside"):
        _read_all(path)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="matches no file"):
        RecordFileDataSource(str(tmp_path / "*.crec"))
    with pytest.raises(ValueError, match="compression='nope' is unknown"):
        RecordWriter(tmp_path / "x.crec", compression="nope")
    with pytest.raises(ValueError, match="power of two"):
        RecordWriter(tmp_path / "x.crec", alignment=3)


def test_source_reopens_in_another_process(tmp_path: Path) -> None:
    import multiprocessing
    import operator
    from concurrent.futures import ProcessPoolExecutor

    src = RecordFileDataSource(_write(tmp_path / "d.crec", RECORDS, compression="zstd"))
    assert src[1] == RECORDS[1]  # opened (mapped) here first
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert pool.submit(operator.getitem, src, 3).result() == RECORDS[3]


def test_missing_zstandard_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ImportError, match=r"needs zstandard: pip install 'chute\[zstd\]'"):
        RecordWriter(tmp_path / "z.crec", compression="zstd")
    assert not list(tmp_path.iterdir())
