"""Which client reads a URL: obstore for s3/gs/az/http(s), fsspec for the rest, for
options obstore cannot express, with `CHUTE_REMOTE_HTTP=fsspec`, and (with a one-line
note) when obstore is not installed; the records are the same either way (moto's S3
server on 127.0.0.1)."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import chute
from chute import sources
from chute._src.storage.remote import stores, urls
from remote_helpers import use_remote_env

LINES = b"".join(b'{"i": %d}\n' % i for i in range(200))


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("obstore", reason="needs obstore (the remote extra)")
    use_remote_env(monkeypatch, tmp_path)


def _object(s3_server: Any) -> str:
    prefix = s3_server.bucket(f"chute-{uuid.uuid4().hex[:8]}")
    s3_server.fs().pipe_file(f"{prefix}/d.jsonl", LINES)
    return f"{prefix}/d.jsonl"


def _client(url: str, options: Any) -> str:
    src = sources.JsonlDataSource(url, storage_options=options, cache_index=False)
    assert [r["i"] for r in src.__getitems__([0, 199, 77])] == [0, 199, 77]
    loc = stores.located(url, options)
    return "obstore" if loc is not None else "fsspec"


def test_s3_reads_through_obstore(s3_server: Any) -> None:
    assert _client(_object(s3_server), s3_server.options) == "obstore"


def test_options_obstore_cannot_express_go_through_fsspec(s3_server: Any) -> None:
    url = _object(s3_server)
    options = {**s3_server.options, "s3_additional_kwargs": {"ACL": "private"}}
    assert _client(url, options) == "fsspec"


def test_chute_remote_http_fsspec_reads_through_fsspec(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHUTE_REMOTE_HTTP", "fsspec")
    assert _client(_object(s3_server), s3_server.options) == "fsspec"


def test_without_obstore_fsspec_reads_with_a_one_line_note(
    s3_server: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)  # `import obstore` fails
    monkeypatch.setattr(stores, "_warned", False)
    caplog.set_level(logging.INFO, logger="chute")
    url = _object(s3_server)
    assert _client(url, s3_server.options) == "fsspec"
    _client(url, s3_server.options)
    notes = [r.getMessage() for r in caplog.records if "obstore is not installed" in r.getMessage()]
    assert len(notes) == 1 and "pip install 'chute[remote]'" in notes[0]
    assert "\n" not in notes[0]


def test_gcs_and_azure_options_are_translated(tmp_path: Path) -> None:
    """Configured, not tested against a server: the stores are built from gcsfs's and
    adlfs's options; an option neither knows sends the URL to fsspec."""
    key = tmp_path / "sa.json"
    key.write_text(
        '{"private_key": "", "private_key_id": "", "client_email": "", "disable_oauth": true}'
    )
    assert stores.located("gs://bucket/a.crec", {"token": str(key)}) is not None
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(chute.DataError, match=r"gs://bucket/a.crec: cannot configure the client"):
        stores.located("gs://bucket/a.crec", {"token": str(tmp_path / "bad.json")})
    assert stores.located("gs://bucket/a.crec", {"project": "p"}) is None
    az = {"account_name": "acct", "account_key": "a2V5"}
    located = stores.located("az://container/a.crec", az)
    assert located is not None and located.kind == "azure" and located.path == "a.crec"


def test_a_bad_deadline_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHUTE_REMOTE_DEADLINE_S", "soon")
    with pytest.raises(ValueError, match=r"CHUTE_REMOTE_DEADLINE_S='soon' is not a number"):
        urls.deadline_s()
    monkeypatch.setenv("CHUTE_REMOTE_DEADLINE_S", "0")
    with pytest.raises(ValueError, match=r"must be above 0; default 60"):
        urls.deadline_s()
