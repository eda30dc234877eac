"""CRC32C: the native extension, its table-driven code and the crc32c package agree.

`chute._src.storage.records.checksum` picks the code once per process; `CHUTE_CRC32C` (documented
there) forces the others, so each is run end to end in a child process.
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c as package
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chute._src.storage.records import checksum

native: Any
try:
    from chute import _native as native
except ImportError:
    native = None

needs_native = pytest.mark.skipif(
    native is None,
    reason="the native extension is not built (pip install -e . with a C compiler builds it)",
)

CHECK = 0xE3069283  # CRC32C of b"123456789" (RFC 3720, iSCSI)
# Lengths around the 8-byte words and the three-lane blocks of 3 x 1024 bytes.
LENGTHS = [*range(70), 1023, 1024, 1025, 3071, 3072, 3073, 3080, 6143, 6144, 6151, 9216, 10_000]


def implementations() -> list[tuple[str, Callable[..., int]]]:
    impls: list[tuple[str, Callable[..., int]]] = [("chosen", checksum.crc32c)]
    if native is not None:
        impls += [("native", native.crc32c), ("native table", native.crc32c_portable)]
    return impls


def test_check_value() -> None:
    assert package.crc32c(b"123456789") == CHECK
    for name, fn in implementations():
        assert fn(b"123456789") == CHECK, name
        assert fn(b"") == 0, name
        assert fn(b"6789", fn(b"12345")) == CHECK, name


def test_agree_on_random_inputs_of_every_kind(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lengths = LENGTHS + [int(n) for n in rng.integers(0, 10_001, size=60)]
    blob = rng.integers(0, 256, size=10_000 + 64, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(blob)
    with open(tmp_path / "blob", "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    for k, n in enumerate(lengths):
        start = k % 13  # unaligned starts
        value = int(rng.integers(0, 2**32))
        expected = package.crc32c(blob[start : start + n], value)
        mapped = memoryview(mm)[start : start + n]
        inputs: dict[str, Any] = {
            "bytes": blob[start : start + n],
            "bytearray": bytearray(blob[start : start + n]),
            "memoryview of bytes": memoryview(blob)[start : start + n],
            "memoryview of mmap": mapped,
            "mmap slice": mm[start : start + n],
            "numpy": np.frombuffer(blob, dtype=np.uint8)[start : start + n],
        }
        try:
            for name, fn in implementations():
                for kind, data in inputs.items():
                    assert fn(data, value) == expected, (name, kind, n, start)
                    assert fn(data) == package.crc32c(data), (name, kind, n, start)
        finally:
            mapped.release()
    mm.close()


def test_agree_above_the_size_that_releases_the_gil() -> None:
    data = np.random.default_rng(1).integers(0, 256, size=(1 << 20) + 77, dtype=np.uint8)
    expected = package.crc32c(data.tobytes(), 12345)
    for name, fn in implementations():
        assert fn(data.tobytes(), 12345) == expected, name
        assert fn(data.data[3:], 7) == package.crc32c(data[3:].tobytes(), 7), name


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4000), st.integers(0, 2**32 - 1), st.integers(0, 7))
def test_agree_on_any_bytes(data: bytes, value: int, skip: int) -> None:
    view = memoryview(data)[skip:]
    for name, fn in implementations():
        assert fn(view, value) == package.crc32c(data[skip:], value), name


@needs_native
def test_read_checked() -> None:
    blob = bytes(range(256)) * 40
    for offset, length in [(0, 0), (0, 1), (3, 200), (5, 3072 * 2 + 5), (10_000, 240)]:
        part = blob[offset : offset + length]
        crc = package.crc32c(part)
        with mmap.mmap(-1, len(blob)) as mm:
            mm[:] = blob
            for buf in (blob, bytearray(blob), memoryview(blob), mm):
                got = native.read_checked(buf, offset, length, crc)
                assert got == part and type(got) is bytes
                assert native.read_checked(buf, offset, length, crc ^ 1) is None
    if os.environ.get("CHUTE_CRC32C", "auto") == "auto":
        assert checksum.read_checked is native.read_checked
    else:
        assert checksum.read_checked is None  # the caller slices and compares itself


@needs_native
def test_native_read_checked_rejects_ranges_outside_the_buffer() -> None:
    crc = package.crc32c(b"")
    assert native.read_checked(b"abc", 3, 0, crc) == b""
    for offset, length in [(0, 4), (2, 2), (4, 0), (-1, 1), (1, -1), (2**40, 1)]:
        with pytest.raises(ValueError, match=r"are not inside the buffer of 3 bytes"):
            native.read_checked(b"abc", offset, length, crc)


@needs_native
def test_native_errors_name_the_value_and_the_rule() -> None:
    for bad in (-1, 2**32, "0", 1.5):
        with pytest.raises(
            ValueError, match=r"is not a CRC32C: it must be an int in \[0, 2\*\*32\)"
        ):
            native.crc32c(b"x", bad)
    with pytest.raises(ValueError, match=r"read_checked: crc=-3 is not a CRC32C"):
        native.read_checked(b"abc", 0, 1, -3)
    with pytest.raises(TypeError, match="bytes-like object is required, not 'str'"):
        native.crc32c("text")
    with pytest.raises(BufferError, match="not C-contiguous"):
        native.crc32c(np.arange(10).data[::2])
    with pytest.raises(TypeError, match=r"takes 1 or 2 arguments \(3 given\)"):
        native.crc32c(b"", 0, 0)


def test_the_implementation_in_effect_is_named() -> None:
    if native is None:
        assert checksum.IMPLEMENTATION.startswith("crc32c package")
    elif os.environ.get("CHUTE_CRC32C", "auto") == "auto":
        assert checksum.IMPLEMENTATION.startswith("native")
        assert ("SSE4.2" in checksum.IMPLEMENTATION) == native.HARDWARE


_CHILD = textwrap.dedent(
    """
    import json, sys
    import chute
    from chute.records import RecordWriter
    from chute.sources import RecordFileDataSource
    from chute._src.storage.records import checksum

    path = sys.argv[1]
    records = [bytes([k % 251]) * (k * 37 % 5000) for k in range(300)]
    with RecordWriter(path) as w:
        for r in records:
            w.write(r)
    src = RecordFileDataSource(path)
    assert [src[i] for i in range(300)] == records
    assert src.__getitems__(list(range(299, -1, -1))) == records[::-1]
    buf = bytearray(sum(map(len, records)))
    ends = src.read_into(list(range(300)), buf)
    assert bytes(buf[ends[7] : ends[8]]) == records[7]
    src.close()
    data = bytearray(open(path, "rb").read())
    pos = data.find(records[200])
    data[pos + 10] ^= 0xFF  # corrupt record 200
    open(path, "wb").write(bytes(data))
    src = RecordFileDataSource(path)
    errors = []
    for read in (lambda: src[200], lambda: src.__getitems__([1, 200])):
        try:
            read()
        except chute.DataError as e:
            errors.append(str(e))
    print(json.dumps({"implementation": checksum.IMPLEMENTATION,
                      "check": checksum.crc32c(b"123456789"), "errors": errors}))
    """
)


def _run_child(tmp_path: Path, setting: str) -> dict[str, Any]:
    env = {**os.environ, "CHUTE_CRC32C": setting}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / f"{setting}.crec")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_every_setting_writes_reads_and_reports_corruption_alike(tmp_path: Path) -> None:
    results = {s: _run_child(tmp_path, s) for s in checksum.SETTINGS}
    assert results["package"]["implementation"] == (
        "crc32c package (CHUTE_CRC32C)"
        if native is not None
        else "crc32c package (the native extension is not built)"
    )
    if native is not None:
        assert results["portable"]["implementation"] == (
            "native, table-driven (CHUTE_CRC32C=portable)"
        )
        assert results["auto"]["implementation"].startswith("native, ")
    for setting, result in results.items():
        assert result["check"] == CHECK, setting
        assert len(result["errors"]) == 2, setting
        for error in result["errors"]:
            assert f"{setting}.crec: record 200: the payload fails its CRC32C check" in error
    # The same file, the same corruption: the same messages whatever computed the CRCs.
    messages = {
        json.dumps(r["errors"]).replace(f"{s}.crec", "data.crec") for s, r in results.items()
    }
    assert len(messages) == 1


def test_an_unknown_setting_is_refused_where_used_with_the_choices(tmp_path: Path) -> None:
    # `import chute` succeeds; the first checksum (writing a .crec file) names the value.
    env = {**os.environ, "CHUTE_CRC32C": "fastest"}
    code = (
        "import sys, chute\n"
        "print('imported')\n"
        "with chute.records.RecordWriter(sys.argv[1]) as w:\n"
        "    w.write(b'x')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "a.crec")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert out.stdout == "imported\n"
    assert (
        "ValueError: CHUTE_CRC32C='fastest' is not a CRC32C implementation chute knows; "
        "set it to one of auto, package, portable, or unset it"
    ) in out.stderr
