"""ArrayRecordDataSource through chute.sources (the array-record extra is in `test`)."""

from __future__ import annotations

import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from array_record.python import array_record_module

from chute.sources import ArrayRecordDataSource

RECORDS = [b"record %d " % i * (1 + i % 7) for i in range(1000)]


def _write(path: Path, records: list[bytes], group_size: int) -> str:
    w = array_record_module.ArrayRecordWriter(str(path), f"group_size:{group_size}")
    for r in records:
        w.write(r)
    w.close()
    return str(path)


@pytest.mark.parametrize("group_size", [1, 64])
def test_random_access_single_and_batched(tmp_path: Path, group_size: int) -> None:
    src = ArrayRecordDataSource(
        _write(tmp_path / "a.array_record", RECORDS, group_size), chunk_cache_size=2
    )
    assert len(src) == 1000
    order = [int(i) for i in np.random.default_rng(0).permutation(1000)]
    assert [src[i] for i in order[:200]] == [RECORDS[i] for i in order[:200]]
    assert src.__getitems__(order) == [RECORDS[i] for i in order]
    assert src.__getitems__(order[:5]) == [RECORDS[i] for i in order[:5]]
    assert src[-1] == RECORDS[-1]


def test_many_files_threads_and_pickle(tmp_path: Path) -> None:
    paths = [
        _write(tmp_path / "a.array_record", RECORDS[:400], 1),
        _write(tmp_path / "b.array_record", RECORDS[400:], 16),
    ]
    src = ArrayRecordDataSource(paths)
    assert len(src) == 1000

    def check(seed: int) -> bool:
        order = np.random.default_rng(seed).permutation(1000)
        return all(src[int(i)] == RECORDS[i] for i in order)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(check, range(4)))
    clone = pickle.loads(pickle.dumps(src))
    assert clone.__getitems__(list(range(1000))) == RECORDS
    assert repr(clone) == f"ArrayRecordDataSource(<2 files: {paths[0]!r}, ...>)"


def test_reader_options_and_missing_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.array_record", RECORDS[:10], 1)
    assert (
        ArrayRecordDataSource([path], reader_options={"index_storage_option": "in_memory"})[9]
        == (RECORDS[9])
    )
    with pytest.raises(FileNotFoundError, match="no such file"):
        ArrayRecordDataSource(str(tmp_path / "missing.array_record"))


@pytest.mark.parametrize("options", ["group_size:1", "group_size:1,uncompressed"])
def test_direct_reads_match_the_cpp_reader(
    tmp_path: Path, options: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "beside")
    rng = np.random.default_rng(2)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 150_000, size=40)] + RECORDS[:100]
    path = str(tmp_path / "big.array_record")
    w = array_record_module.ArrayRecordWriter(path, options)
    for r in records:
        w.write(r)
    w.close()
    direct = ArrayRecordDataSource(path)
    via_reader = ArrayRecordDataSource(path, direct=False)
    order = [int(i) for i in rng.permutation(len(records))]
    assert [direct[i] for i in order] == [records[i] for i in order]
    assert via_reader.__getitems__(order) == [records[i] for i in order]
    assert (tmp_path / ".big.array_record.arrayrecord-crc.chute-index").exists()
    assert ArrayRecordDataSource(path)[5] == records[5]  # from the cached index


def test_corrupt_compressed_record_raises_data_error(tmp_path: Path) -> None:
    from chute import DataError

    records = [b"compressible text, " * 50 + b"%d" % i for i in range(20)]
    path = tmp_path / "c.array_record"
    _write(path, records, 1)
    data = bytearray(path.read_bytes())
    data[64 + 40 + 30] ^= 0xFF  # inside the first data chunk's compressed bytes
    path.write_bytes(bytes(data))
    src = ArrayRecordDataSource(str(path))
    with pytest.raises(DataError, match=r"c\.array_record: record 0 could not be read"):
        for i in range(len(src)):
            assert src[i] == records[i]


def test_corruption_after_indexing_is_caught_by_the_recorded_crc(tmp_path: Path) -> None:
    from chute import DataError

    records = [b"compressible text, " * 50 + b"%d" % i for i in range(20)]
    path = tmp_path / "c.array_record"
    _write(path, records, 1)
    src = ArrayRecordDataSource(str(path))
    assert src[0] == records[0]  # builds the index, with each record's CRC32C
    with open(path, "r+b") as f:  # corrupted in place while the source has it mapped
        f.seek(64 + 40 + 30)
        byte = f.read(1)
        f.seek(64 + 40 + 30)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DataError, match=r"c\.array_record: record 0 could not be read .*CRC32C"):
        src[0]
    # A new source sees the edit (the cache is bound to the file's ctime and content) and
    # reads through the C++ reader, which checks the chunk's own hash.
    with pytest.raises(DataError, match=r"c\.array_record: record 0 could not be read .*hash"):
        ArrayRecordDataSource(str(path))[0]


def test_missing_array_record_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    path = _write(tmp_path / "a.array_record", RECORDS[:3], 1)
    monkeypatch.setitem(sys.modules, "array_record", None)
    monkeypatch.setitem(sys.modules, "array_record.python", None)
    with pytest.raises(ImportError, match=r"pip install 'chute\[arrayrecord\]'"):
        ArrayRecordDataSource(path)
