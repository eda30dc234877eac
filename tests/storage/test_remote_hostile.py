"""Remote reads against a hostile HTTP server on 127.0.0.1 (`hostile_server.py`): each case
ends in the right records or a `chute.DataError` naming the URL (never its password),
within the deadline (`CHUTE_REMOTE_DEADLINE_S`, tiny here), without buffering more than
the bytes asked for plus a small bound; an object replaced in place is never read
through a stale index; proxies, headers and URL credentials are honoured; an abandoned
read of a stalled server does not hold up the interpreter's exit."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import chute
from chute import sources
from hostile_server import HostileServer, basic
from process_helpers import SRC, run_python
from remote_helpers import read_by_blocks, use_remote_env

pytest.importorskip("obstore", reason="needs obstore (the remote extra)")

DEADLINE_S = 1.5
LINES = [{"i": i, "pad": "x" * 50} for i in range(3000)]  # 200 kB: several blocks
DATA = b"".join(json.dumps(r).encode() + b"\n" for r in LINES)
PICK = [0, 1500, 2999]  # in the first block, and in later ones


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_remote_env(monkeypatch, tmp_path)
    read_by_blocks(monkeypatch)  # objects larger than the cache: later reads ask the server
    monkeypatch.setenv("CHUTE_REMOTE_DEADLINE_S", str(DEADLINE_S))
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "1")
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def _all(src: Any) -> list[Any]:
    return [src[i] for i in range(len(src))]


def _read(url: str, **kwargs: Any) -> list[Any]:
    src = sources.JsonlDataSource(url, cache_index=False, **kwargs)
    return [r["i"] for r in src.__getitems__(PICK)]


# Misbehaviours, each in the first answer ("") or only in the later ones ("-later": the
# object opens, its later blocks meet it). Outcome: the records, or a DataError.
TOLERATED = ["chunked-and-length", "continue", "bare-lf"]
REFUSED = ["negative-chunk", "no-content", "silent", "trickle", "full-200", "huge-length"]
REFUSED += ["huge-chunk", "wrong-content-range"]


@pytest.mark.parametrize("when", ["", "-later"])
@pytest.mark.parametrize("mode", TOLERATED + REFUSED)
def test_each_misbehaviour_ends_in_records_or_a_data_error_in_time(mode: str, when: str) -> None:
    with HostileServer({"/d.jsonl": DATA}, mode=mode + when, max_bytes=64 << 20) as srv:
        url = srv.url("/d.jsonl")
        t0 = time.monotonic()
        if mode in TOLERATED:
            assert _read(url) == PICK
        else:
            with pytest.raises(chute.DataError, match=f"{url}: cannot") as info:
                _read(url)
            # The object is there: whatever went wrong, it was not finding it.
            assert "cannot find it" not in str(info.value)
        # Bounded by the deadline: finding the object, opening it, then one read (a hang
        # would run to the test's timeout).
        assert time.monotonic() - t0 < 4 * DEADLINE_S + 5


@pytest.mark.parametrize("scheme", ["http", "s3"])
@pytest.mark.parametrize("mode", ["full-200", "huge-length", "huge-chunk"])
def test_a_flood_costs_no_more_memory_than_the_range(
    tmp_path: Path, mode: str, scheme: str
) -> None:
    """Ranges of a batch (two objects' blocks) answered with a 2 GiB body each (a 200, a
    206 claiming 10^12 bytes, or a chunk of 10^15): the process's peak RSS grows by less
    than 64 MiB, in a fresh interpreter (the server there streams from one 64 KiB
    buffer). Over plain HTTP, and as an S3-compatible endpoint (obstore's own buffered
    reads, `get_range` and `get_ranges`, take the whole body of such an answer: 3 GiB for
    a 32 KiB range; chute reads every answer as a stream, for every store)."""
    body = f"""
    import json, os, resource, sys
    sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
    from hostile_server import HostileServer
    import chute
    data = {DATA!r}
    os.environ["CHUTE_REMOTE_DEADLINE_S"] = "5"
    os.environ["CHUTE_REMOTE_CACHE_BYTES"] = str(64 << 10)
    os.environ.update(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_REGION="us-east-1")

    def source(srv):
        if {scheme!r} == "http":
            return chute.sources.JsonlDataSource(srv.url("/b/d.jsonl"), cache_index=False)
        options = {{"client_kwargs": {{"endpoint_url": srv.url("")}}}}
        return chute.sources.JsonlDataSource(
            "s3://b/d.jsonl", storage_options=options, cache_index=False
        )

    with HostileServer({{"/b/d.jsonl": data}}, mode="normal") as warm:  # the client's runtime
        source(warm)[2999]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with HostileServer({{"/b/d.jsonl": data}}, max_bytes=2 << 30) as srv:
        src = source(srv)
        assert len(src) == 3000  # opened and indexed; then every answer floods
        srv.mode = {mode!r}
        try:
            src.__getitems__([1500, 2999])
            print("records")
        except chute.DataError as e:
            print("DataError")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
    print(grown // 1024)
    """
    script = tmp_path / "flood.py"
    script.write_text(textwrap.dedent(body))
    out = run_python(tmp_path, [str(script)], timeout=120).stdout.split()
    assert out[0] == "DataError"
    assert int(out[1]) < 64, f"peak RSS grew by {out[1]} MiB"


@pytest.mark.parametrize("etag", [None, '"v1"'])
def test_an_object_replaced_in_place_is_never_read_through_a_stale_index(
    tmp_path: Path, etag: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same size, newer Last-Modified (and a new ETag when it has one): a new source, in
    this process or a new one, reads the new records; the index cache (kept) is not used."""
    # Deadlines are not what this test is about: the suite's short one (DEADLINE_S) can
    # run out on a loaded machine while a new process imports chute and reads.
    monkeypatch.setenv("CHUTE_REMOTE_DEADLINE_S", "60")
    with HostileServer({"/n.jsonl": b"1\n22\n333\n"}, etag=etag) as srv:
        url = srv.url("/n.jsonl")
        assert _all(sources.JsonlDataSource(url)) == [1, 22, 333]  # indexed, cached
        srv.replace("/n.jsonl", b"11\n2\n333\n", etag=etag and '"v2"', later_s=5)
        assert _all(sources.JsonlDataSource(url)) == [11, 2, 333]
        script = tmp_path / "again.py"
        script.write_text(f"import chute\nprint(list(chute.sources.JsonlDataSource({url!r})))\n")
        assert run_python(tmp_path, [str(script)]).stdout.strip() == "[11, 2, 333]"


def test_a_later_answer_without_the_etag_is_refused() -> None:
    with HostileServer({"/d.jsonl": DATA}, mode="etag-first-only") as srv:
        url = srv.url("/d.jsonl")
        with pytest.raises(chute.DataError, match=f"{url}: the object changed"):
            _read(url)


def test_an_object_replaced_while_open_is_a_data_error() -> None:
    with HostileServer({"/d.jsonl": DATA}, etag=None) as srv:
        url = srv.url("/d.jsonl")
        src = sources.JsonlDataSource(url, cache_index=False)
        assert src[0]["i"] == 0
        srv.replace("/d.jsonl", DATA.replace(b'"i": 1500', b'"i": 9999'), etag=None, later_s=5)
        with pytest.raises(chute.DataError, match=f"{url}: the object changed"):
            src.__getitems__([1500])  # in a block the cache does not hold


def test_cache_index_false_writes_no_index(tmp_path: Path) -> None:
    with HostileServer({"/d.jsonl": DATA}) as srv:
        assert len(sources.JsonlDataSource(srv.url("/d.jsonl"), cache_index=False)) == 3000
        cache = tmp_path / "cache"
        assert not cache.exists() or not any(cache.rglob("*.chute-index"))
        assert len(sources.JsonlDataSource(srv.url("/d.jsonl"))) == 3000
        assert any(cache.rglob("*.chute-index"))


def test_url_credentials_are_sent_and_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with HostileServer({"/d.jsonl": DATA}, require_auth=basic("alice", "hunter2pass")) as srv:
        assert _read(srv.url("/d.jsonl", "alice:hunter2pass@")) == PICK
        wrong = srv.url("/d.jsonl", "alice:wrongpass@")
        with pytest.raises(chute.DataError) as info:
            _read(wrong)
        shown = srv.url("/d.jsonl", "alice@")
        assert str(info.value).startswith(f"{shown}: ")
        assert "access denied" in str(info.value)
        # Stalled: the error and every log line name the URL without the password.
        srv.mode = "silent"
        with pytest.raises(chute.DataError, match=f"{shown}: cannot") as info:
            _read(srv.url("/d.jsonl", "alice:hunter2pass@"))
        # A bad record names its object the same way.
        srv.mode = "normal"
        srv.files["/bad.jsonl"] = b'{"i": 0}\n{"i": \n'
        bad = sources.JsonlDataSource(srv.url("/bad.jsonl", "alice:hunter2pass@"))
        with pytest.raises(chute.DataError) as bad_info:
            bad[1]
        assert str(bad_info.value).startswith(srv.url("/bad.jsonl", "alice@") + ": record 1")
    for text in [str(info.value), str(bad_info.value), caplog.text]:
        assert "hunter2pass" not in text and "wrongpass" not in text


def test_an_authorization_header_from_storage_options_is_sent() -> None:
    with HostileServer({"/d.jsonl": DATA}, require_auth="Bearer t0ken") as srv:
        url = srv.url("/d.jsonl")
        assert _read(url, storage_options={"headers": {"Authorization": "Bearer t0ken"}}) == PICK
        with pytest.raises(chute.DataError, match=f"{url}: .*access denied"):
            _read(url)


def test_paths_with_spaces_latin1_and_cjk_are_percent_encoded_utf8() -> None:
    sent = "/my%20data/donn%C3%A9es%20%E6%95%B0%E6%8D%AE.jsonl"
    with HostileServer({sent: DATA}) as srv:
        assert _read(srv.url("/my data/données 数据.jsonl")) == PICK
        assert _read(srv.url(sent)) == PICK  # given encoded: the same object
        assert {r.target for r in srv.requests} == {sent}


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_an_ipv6_host() -> None:
    with HostileServer({"/d.jsonl": DATA}, host="::1") as srv:
        assert _read(srv.url("/d.jsonl")) == PICK
        assert {r.headers["host"] for r in srv.requests} == {f"[::1]:{srv.port}"}


def test_a_proxy_from_the_environment_sees_the_requests(tmp_path: Path) -> None:
    """`HTTP_PROXY` as set when the process starts (the HTTP client reads it once)."""
    with HostileServer({"/d.jsonl": DATA}) as origin, HostileServer({}) as proxy:
        url = origin.url("/d.jsonl")
        script = tmp_path / "proxied.py"
        script.write_text(
            "import chute\n"
            f"src = chute.sources.JsonlDataSource({url!r}, cache_index=False)\n"
            f"print([src[i]['i'] for i in {PICK!r}])\n"
        )
        env = {**os.environ, "HTTP_PROXY": f"http://127.0.0.1:{proxy.port}"}
        assert run_python(tmp_path, [str(script)], env=env).stdout.strip() == str(PICK)
        assert len(proxy.requests) >= 2 and all(r.target == url for r in proxy.requests)


def test_a_proxy_from_the_storage_options_sees_the_requests() -> None:
    with HostileServer({"/d.jsonl": DATA}) as origin, HostileServer({}) as proxy:
        url = origin.url("/d.jsonl")
        for options in [
            {"proxy": f"http://127.0.0.1:{proxy.port}"},  # fsspec's HTTP request option
            {"client_kwargs": {"proxy": f"http://127.0.0.1:{proxy.port}"}},  # aiohttp's
        ]:
            seen = len(proxy.requests)
            assert _read(url, storage_options=options) == PICK
            assert len(proxy.requests) >= seen + 2


def test_s3_through_a_proxy_from_config_kwargs(s3_server: Any, tmp_path: Path) -> None:
    import uuid

    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    s3_server.fs().pipe_file(f"{prefix}/d.jsonl", DATA)
    with HostileServer({}) as proxy:
        options = {
            **s3_server.options,
            "config_kwargs": {"proxies": {"http": f"http://127.0.0.1:{proxy.port}"}},
        }
        assert _read(f"{prefix}/d.jsonl", storage_options=options) == PICK
        assert len(proxy.requests) >= 2


def test_an_abandoned_read_of_a_stalled_server_does_not_delay_exit(tmp_path: Path) -> None:
    """A stream's read-ahead is waiting on a server that stopped answering (the default
    60 s deadline): the interpreter exits at once, printing nothing."""
    # The first block and the first 1 MiB window are answered, then nothing.
    with HostileServer({"/d.jsonl": DATA * 20}, mode="silent-later", normal_answers=2) as srv:
        script = tmp_path / "abandon.py"
        script.write_text(
            textwrap.dedent(
                f"""
                import sys, time
                import chute
                ds = chute.experimental.JsonlIterDataset([{srv.url("/d.jsonl")!r}])
                it = iter(ds)
                next(it)  # lines from the first window; the next is asked for, and more
                # lines for the interleave's read-ahead, on a thread of its pool
                time.sleep(0.3)
                print("abandoned", flush=True)
                """
            )
        )
        env = {**os.environ, "PYTHONPATH": SRC, "CHUTE_REMOTE_DEADLINE_S": "60"}
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "abandoned"
            t0 = time.monotonic()
            out, err = proc.communicate(timeout=30)
            exited_in = time.monotonic() - t0
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        assert out == "" and err == ""
        assert exited_in < 1.5, f"exit took {exited_in:.1f} s"
        assert len(srv.requests) >= 3  # the read-ahead was asked for, and never answered
