"""JsonlDataSource through chute.sources."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import pytest

from chute import DataError
from chute.sources import JsonlDataSource

ROWS = [{"title": f"t{i}", "label": i % 4, "text": "é" * i} for i in range(50)]


def _write(path: Path, rows: Sequence[object], newline: str = "\n", trailing: bool = True) -> Path:
    text = newline.join(json.dumps(r) for r in rows) + (newline if trailing else "")
    path.write_bytes(text.encode())
    return path


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("trailing", [True, False])
def test_random_access(tmp_path: Path, newline: str, trailing: bool) -> None:
    src = JsonlDataSource(_write(tmp_path / "d.jsonl", ROWS, newline, trailing))
    assert len(src) == len(ROWS)
    assert [src[i] for i in range(len(ROWS))] == ROWS
    assert src.__getitems__([49, 0, 7]) == [ROWS[49], ROWS[0], ROWS[7]]
    assert src[-1] == ROWS[-1]
    with pytest.raises(IndexError, match="out of range"):
        src[50]


def test_blank_lines_are_skipped_and_raw_lines_kept(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_bytes(b'\n{"a": 1}\n\n\n{"a": 2}\r\n\n')
    assert [JsonlDataSource(path)[i] for i in range(2)] == [{"a": 1}, {"a": 2}]
    assert JsonlDataSource(path, decode=False).__getitems__([0, 1]) == [b'{"a": 1}', b'{"a": 2}']


def test_index_is_cached_and_invalidated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "beside")
    path = _write(tmp_path / "d.jsonl", ROWS)
    assert len(JsonlDataSource(path)) == 50
    caches = [p.name for p in tmp_path.iterdir() if p.name.endswith(".chute-index")]
    assert caches == [".d.jsonl.jsonl-lines.chute-index"]
    assert JsonlDataSource(path)[3] == ROWS[3]
    _write(path, ROWS[:10])
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    src = JsonlDataSource(path)
    assert len(src) == 10 and src[9] == ROWS[9]
    no_cache = tmp_path / "n.jsonl"
    _write(no_cache, ROWS)
    assert len(JsonlDataSource(no_cache, cache_index=False)) == 50
    assert not (tmp_path / ".n.jsonl.jsonl-lines.chute-index").exists()


def test_corrupt_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUTE_INDEX_CACHE", "beside")
    path = _write(tmp_path / "d.jsonl", ROWS)
    len(JsonlDataSource(path))
    cache = tmp_path / ".d.jsonl.jsonl-lines.chute-index"
    cache.write_bytes(cache.read_bytes()[:-3] + b"\xff\xff\xff")
    assert JsonlDataSource(path)[49] == ROWS[49]


def test_bad_json_names_file_record_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": \n{"a": 3}\n')
    src = JsonlDataSource(path)
    assert src[2] == {"a": 3}
    with pytest.raises(DataError, match=r"bad\.jsonl: record 1 \(line 3\) is not valid JSON"):
        src[1]


def test_many_files_pickle_and_repr(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", ROWS[:20])
    _write(tmp_path / "b.jsonl", ROWS[20:])
    (tmp_path / "c.jsonl").write_bytes(b"")
    src = JsonlDataSource(str(tmp_path / "*.jsonl"))
    assert len(src) == 50
    clone = pickle.loads(pickle.dumps(src))
    assert [clone[i] for i in range(50)] == ROWS
    assert repr(JsonlDataSource(a)) == f"JsonlDataSource({str(a)!r}, decode=True)"
