"""Remote failures give clear `chute.DataError`s naming the URL: an unreachable endpoint,
a missing object, an object that changes between indexing and reading; transient
failures are retried a bounded number of times, each retry logged. A real S3 server
(moto) behind a real TCP proxy that drops connections; no mocks."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

import pytest

import chute
from chute import sources
from chute._src.storage.remote import file as remote_file
from chute.records import RecordWriter
from remote_helpers import TcpProxy, read_by_blocks


def _options(port: int) -> dict[str, Any]:
    # One attempt per botocore call, so the proxy's drops reach s3fs's and chute's retries.
    return {
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
    }


def _upload(s3_server: Any, tmp_path: Path, n: int = 200, tag: bytes = b"r") -> str:
    bucket = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    path = tmp_path / "d.crec"
    with RecordWriter(path) as w:
        for i in range(n):
            w.write(tag + b"%d" % i)
    s3_server.fs().put_file(str(path), f"{bucket}/d.crec")
    return f"{bucket}/d.crec"


def _replace(s3_server: Any, tmp_path: Path, url: str) -> None:
    """Replaces the object of `_upload(..., n=20000)` in place by other content (the same
    record count, other bytes)."""
    (tmp_path / "new").mkdir()
    with RecordWriter(tmp_path / "new" / "d.crec") as w:
        for i in range(20000):
            w.write(b"other-%d" % i)
    s3_server.fs().put_file(str(tmp_path / "new" / "d.crec"), url)


def test_missing_object_names_the_url(s3_server: Any) -> None:
    bucket = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    url = f"{bucket}/nothing.crec"
    with pytest.raises(chute.DataError, match=f"{url}: no such object.*check the URL"):
        sources.RecordFileDataSource(url, storage_options=s3_server.options)
    with pytest.raises(FileNotFoundError):  # also a FileNotFoundError
        sources.JsonlDataSource(f"{bucket}/*.jsonl", storage_options=s3_server.options)


def test_unreachable_endpoint_is_retried_then_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "1")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = "s3://chute-nowhere/d.crec"
    with pytest.raises(chute.DataError, match=f"{url}: cannot .*max_retries: 1.*the endpoint"):
        sources.RecordFileDataSource(url, storage_options=_options(port))


def test_object_changed_after_indexing(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Larger than the cache, so later reads fetch parts not read at indexing.
    read_by_blocks(monkeypatch)
    url = _upload(s3_server, tmp_path, n=20000)
    src = sources.RecordFileDataSource(url, storage_options=s3_server.options)
    assert src[3] == b"r3"
    _replace(s3_server, tmp_path, url)
    with pytest.raises(chute.DataError, match=f"{url}: the object changed after chute opened"):
        src.__getitems__([8000, 8001, 9000])
    # Removed: named as removed.
    s3_server.fs().rm(url)
    with pytest.raises(chute.DataError, match=f"{url}: the object was removed"):
        src.__getitems__([12000, 12001])


def test_object_changed_before_its_first_read_is_caught_when_read_whole(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The object fits in the cache: its first read that misses fetches all of it, checked
    # against the size and ETag it had when opened, so a replacement before then is caught.
    # (Only its first block is read when it is found: read whole then, it would be served
    # as opened, index and records alike, with no later read to meet the replacement.)
    read_by_blocks(monkeypatch, cache_bytes=64 << 20)
    monkeypatch.setattr(remote_file, "_FIRST_MAX", 1)
    url = _upload(s3_server, tmp_path, n=20000)
    src = sources.RecordFileDataSource(url, storage_options=s3_server.options)
    _replace(s3_server, tmp_path, url)
    with pytest.raises(chute.DataError, match=f"{url}: the object changed after chute opened"):
        src.__getitems__([8000, 8001, 9000])


def test_dropped_connections_are_retried(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _upload(s3_server, tmp_path)
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "5")
    # The store drops the first connections, then serves again: the client's retries
    # (obstore's, with backoff, within the deadline) get through.
    with TcpProxy(s3_server.port, drop_first=3) as proxy:
        src = sources.RecordFileDataSource(url, storage_options=_options(proxy.port))
        assert src[5] == b"r5"
        assert proxy.dropped == 3


def test_retries_are_bounded(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_by_blocks(monkeypatch)  # later reads go to the store
    url = _upload(s3_server, tmp_path, n=20000)
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "1")
    with TcpProxy(s3_server.port) as proxy:
        src = sources.RecordFileDataSource(url, storage_options=_options(proxy.port))
        assert src[1] == b"r1"
        proxy.drop_remaining = 10**6  # the store goes away after indexing
        with pytest.raises(chute.DataError, match=f"{url}: cannot read it.*max_retries: 1"):
            src.__getitems__([8000, 9000])
