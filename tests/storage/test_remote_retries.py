"""One retry policy: the client library's, configured by `CHUTE_REMOTE_RETRIES`. chute
wraps no retry loop around s3fs (botocore's `retries` config) or obstore (its
`retry_config`): a transient failure is retried by the client, as many times as
configured and no more, and a permanent one surfaces at once as a `DataError` naming the
URL. Against the keep-alive `RangeServer` on 127.0.0.1, which fails GETs as S3 does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import chute
from chute import sources
from chute.records import RecordWriter
from remote_helpers import RangeServer, use_remote_env

RECORDS = [bytes([i % 251]) * 1024 for i in range(400)]
FAR = [300, 301, 350]  # in blocks not read when the source opened


@pytest.fixture(autouse=True, params=["fsspec", "obstore"])
def client(request: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
    if request.param == "obstore":
        pytest.importorskip("obstore", reason="needs obstore (the remote extra)")
    else:
        monkeypatch.setenv("CHUTE_REMOTE_HTTP", "fsspec")  # s3:// through s3fs
    use_remote_env(monkeypatch, tmp_path, block_cache=False)
    (tmp_path / "served" / "b").mkdir(parents=True)
    with RecordWriter(tmp_path / "served" / "b" / "d.crec") as w:
        for r in RECORDS:
            w.write(r)
    return str(request.param)


def _source(tmp_path: Path, server: RangeServer) -> Any:
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {
            "endpoint_url": f"http://127.0.0.1:{server.port}",
            "region_name": "us-east-1",
        },
    }
    src = sources.RecordFileDataSource("s3://b/d.crec", storage_options=options)
    assert src[0] == RECORDS[0]  # opened: later reads are GETs of ranges
    return src


@pytest.mark.parametrize("status", [503, 500])
def test_a_transient_failure_is_retried_by_the_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "3")
    with RangeServer(str(tmp_path / "served"), fail_status=status) as server:
        src = _source(tmp_path, server)
        server.fail_remaining = 2
        assert src.__getitems__(FAR) == [RECORDS[i] for i in FAR]
        assert server.fail_remaining == 0


@pytest.mark.parametrize("retries", [0, 2])
def test_the_client_retries_as_often_as_configured_and_no_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retries: int
) -> None:
    # A 500 (not SlowDown, which s3fs retries again on its own): each GET that fails is
    # one of the client's attempts, CHUTE_REMOTE_RETRIES + 1 in all, then a DataError.
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", str(retries))
    with RangeServer(str(tmp_path / "served"), fail_status=500) as server:
        src = _source(tmp_path, server)
        server.fail_remaining = 10**6
        before = server.gets
        with pytest.raises(
            chute.DataError, match=r"s3://b/d\.crec: cannot read it.*(500|[Ii]nternal)"
        ):
            src.__getitems__([300])
        assert server.gets - before == retries + 1


def test_a_permanent_failure_surfaces_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "3")
    with RangeServer(str(tmp_path / "served")) as server:
        src = _source(tmp_path, server)
        server.deny = True
        before = server.gets
        with pytest.raises(chute.DataError, match=r"s3://b/d\.crec: access denied.*credentials"):
            src.__getitems__([300])
        assert server.gets - before == 1
