"""Servers without Range support, as the hostile server plays them ("no-ranges": a `200`
and the whole object for every GET, as Python's `http.server` answers; "ranges-ignored":
the same while it says `Accept-Ranges: bytes`), from the first answer or only later
ones: random access reads each object whole, once, and keeps it; a stream reads it in
order from one plain GET, whatever the cache; an object too large to keep is a
`DataError` naming the URL, its size, the cap and the fixes. A server that answers with
another range than asked is refused, naming the URL, and no error says "cannot find it"
of an object that exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import chute
from chute import sources
from hostile_server import HostileServer
from remote_helpers import read_by_blocks, use_remote_env

pytest.importorskip("obstore", reason="needs obstore (the remote extra)")

N = 30_000
BIG = b"".join(json.dumps({"i": i, "pad": "y" * 40}).encode() + b"\n" for i in range(N))
PICK = [0, 1, 14_999, 29_999]  # the first bytes, and far past the first read (1 MiB)
MODES = ["no-ranges", "ranges-ignored", "no-ranges-later", "ranges-ignored-later"]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_remote_env(monkeypatch, tmp_path)
    read_by_blocks(monkeypatch, 16 << 20)  # holds BIG (1.9 MB) whole
    monkeypatch.setenv("CHUTE_REMOTE_DEADLINE_S", "30")
    monkeypatch.setenv("CHUTE_REMOTE_RETRIES", "1")
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def _plain(srv: HostileServer) -> int:
    return sum(1 for r in srv.requests if r.method == "GET" and "range" not in r.headers)


@pytest.mark.parametrize("mode", MODES)
def test_random_access_reads_the_object_whole_once_and_keeps_it(mode: str) -> None:
    assert len(BIG) > 1 << 20  # more than the first read
    with HostileServer({"/d.jsonl": BIG}, mode=mode) as srv:
        src = sources.JsonlDataSource(srv.url("/d.jsonl"), cache_index=False)
        assert len(src) == N
        assert [r["i"] for r in src.__getitems__(PICK)] == PICK
        asked = len(srv.requests)
        assert 1 <= _plain(srv) <= 2  # the first bytes (when the first answer refused), all
        more = list(range(3, N, 997))
        assert [r["i"] for r in src.__getitems__(more)] == more
        assert len(srv.requests) == asked  # kept: every later read is a slice


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_reads_in_order_from_a_plain_get_larger_than_the_cache(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_by_blocks(monkeypatch, 256 << 10)  # far smaller than the object: it is not kept
    with HostileServer({"/d.jsonl": BIG}, mode=mode) as srv:
        ds = chute.experimental.JsonlIterDataset([srv.url("/d.jsonl")])
        assert [r["i"] for r in ds] == list(range(N))
        refused = [k for k, r in enumerate(srv.requests) if "range" in r.headers]
        # After the first range the server refused (or the one it answered, then the
        # first it refused), every request is a plain GET.
        assert all("range" not in r.headers for r in srv.requests[max(refused) + 1 :])
        assert _plain(srv) >= 1


def test_a_stream_restored_mid_object_skips_to_its_place() -> None:
    with HostileServer({"/d.jsonl": BIG}, mode="no-ranges") as srv:
        ds = chute.experimental.JsonlIterDataset([srv.url("/d.jsonl")])
        it = iter(ds)
        head = [next(it)["i"] for _ in range(20_000)]
        state = it.get_state()
        it2 = iter(ds)
        it2.set_state(state)
        assert head == list(range(20_000))
        assert [r["i"] for r in it2] == list(range(20_000, N))


def test_random_access_to_an_object_larger_than_the_cache_names_url_size_cap_and_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_by_blocks(monkeypatch, 64 << 10)
    with HostileServer({"/d.jsonl": BIG}, mode="no-ranges") as srv:
        url = srv.url("/d.jsonl")
        src = sources.JsonlDataSource(url, cache_index=False)
        want = (
            rf"{re.escape(url)}: cannot read it as a JSON Lines file: its server answers "
            r"range requests without the range .* at "
            rf"{len(BIG):,} bytes it is larger than the 49,152 bytes the cache keeps whole .*"
            r"serve the files from a server that supports Range requests, read them as a "
            rf"stream .*CHUTE_REMOTE_CACHE_BYTES={-(-len(BIG) * 4 // 3)} or more"
        )
        with pytest.raises(chute.DataError, match=want):
            src[5]


@pytest.mark.parametrize("when", ["", "-later"])
def test_another_range_than_asked_is_refused_naming_the_url(
    when: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_by_blocks(monkeypatch, 64 << 10)  # later reads go to the server
    with HostileServer({"/d.jsonl": BIG}, mode="wrong-content-range" + when) as srv:
        url = srv.url("/d.jsonl")
        with pytest.raises(chute.DataError) as info:
            src = sources.JsonlDataSource(url, cache_index=False)
            src.__getitems__(PICK)
        message = str(info.value)
        assert message.startswith(f"{url}: cannot read it")
        assert "answered a range request with another range" in message
        assert "cannot find it" not in message
