"""Fuzz: corrupted .crec files raise chute.DataError or read back the original records."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chute import DataError
from chute.records import RecordWriter
from chute.sources import RecordFileDataSource

_RECORDS = [b"", b"short", b"some text that compresses, text that compresses" * 4] + [
    b"record number %d with a little payload" % i for i in range(40)
]


def _base(kind: str) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "base.crec"
        options = {
            "raw": {},
            "zstd": {"compression": "zstd"},
            "dict": {"compression": "zstd", "train_dictionary": True},
        }[kind]
        with RecordWriter(path, metadata={"k": 1}, **options) as w:  # type: ignore[arg-type]
            for r in _RECORDS:
                w.write(r)
        return path.read_bytes()


_BASES = {kind: _base(kind) for kind in ("raw", "zstd", "dict")}

corruption = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**9), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 10**9), st.just(0)),
    st.tuples(st.just("overwrite"), st.integers(0, 10**9), st.integers(0, 255)),
    st.tuples(st.just("extend"), st.integers(1, 100), st.integers(0, 255)),
)


def _apply(data: bytes, how: tuple[str, int, int]) -> bytes:
    kind, pos, arg = how
    buf = bytearray(data)
    if kind == "flip":
        buf[pos % len(buf)] ^= 1 << arg
    elif kind == "truncate":
        del buf[pos % len(buf) :]
    elif kind == "overwrite":
        start = pos % len(buf)
        buf[start : start + 8] = bytes([arg]) * len(buf[start : start + 8])
    else:
        buf += bytes([arg]) * pos
    return bytes(buf)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(sorted(_BASES)),
    hows=st.lists(corruption, min_size=1, max_size=3),
    verify=st.booleans(),
)
def test_corrupted_files_raise_only_data_error(
    kind: str, hows: list[tuple[str, int, int]], verify: bool
) -> None:
    data = _BASES[kind]
    for how in hows:
        data = _apply(data, how) if data else data
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "fuzz.crec"
        path.write_bytes(data)
        try:
            src = RecordFileDataSource(path, verify_checksums=verify)
            got = [src[i] for i in range(len(src))]
            buf = bytearray(sum(len(r) for r in got))
            src.read_into(list(range(len(src))), buf)
            src.close()
        except DataError as e:
            assert "fuzz.crec" in str(e)
            return
    if verify:
        # Whatever was not detected must be harmless: the records read back unchanged.
        assert got == _RECORDS


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(st.binary(max_size=300) | st.text(max_size=200).map(str.encode), max_size=60),
    compression=st.sampled_from(["none", "zstd"]),
    alignment=st.sampled_from([1, 8, 64]),
    per_shard=st.integers(1, 30),
)
def test_any_records_round_trip(
    records: list[bytes], compression: str, alignment: int, per_shard: int
) -> None:
    from chute.records import ShardedRecordWriter

    with tempfile.TemporaryDirectory() as d:
        one = Path(d) / "one.crec"
        with RecordWriter(one, compression=compression, alignment=alignment) as w:
            for r in records:
                w.write(r)
        with ShardedRecordWriter(Path(d) / "many", records_per_shard=per_shard) as sw:
            for r in records:
                sw.write(r)
        for src in (RecordFileDataSource(one), RecordFileDataSource(Path(d) / "many")):
            assert len(src) == len(records)
            assert src.__getitems__(list(range(len(records)))[::-1]) == records[::-1]
            buf = bytearray(sum(map(len, records)))
            ends = src.read_into(list(range(len(records))), buf)
            assert bytes(buf) == b"".join(records)
            assert list(ends[1:] - ends[:-1]) == [len(r) for r in records]
