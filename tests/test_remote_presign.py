"""chute's presigner (`_src/remote/presign.py`) against botocore's own output: for both
signature schemes botocore makes (S3's query auth, its default here, and SigV4), custom
endpoints and AWS's virtual-host addressing, session tokens, and keys that need quoting;
`presign_all` asks botocore once per bucket, falls back to botocore for every URL when
its check fails, and the URLs it makes are accepted by a real S3 server (moto)."""

from __future__ import annotations

import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from chute._src.remote import presign, ranges

sys.path.insert(0, str(Path(__file__).parent))
from remote_helpers import use_remote_env

pytest.importorskip("s3fs", reason="needs s3fs (the test extra)")
import s3fs

KEYS = [
    "plain/shard-00.jsonl",
    "with space/a b.txt",
    "unicode/ü ñ 日本.jsonl",
    "plus+equals=/x+y=z.txt",
    "deep/a/b/c/~tilde-_.txt",
    "odd/#hash?q&amp;%25.txt",
]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_remote_env(monkeypatch, tmp_path)


class CountingS3(s3fs.S3FileSystem):
    """s3fs, counting the URLs botocore presigns (a subclass: the real client signs)."""

    signed = 0

    async def _url(self, path: str, expires: int = 3600, **kwargs: Any) -> str:
        type(self).signed += 1
        out: str = await super()._url(path, expires=expires, **kwargs)
        return out


def _fs(cls: Any = s3fs.S3FileSystem, **options: Any) -> Any:
    return cls(skip_instance_cache=True, **options)


CONFIGS: dict[str, dict[str, Any]] = {
    "default scheme, custom endpoint": {
        "key": "AKIDEXAMPLE",
        "secret": "wJalr/XUtnFEMI+K7MDENG=",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"},
    },
    "default scheme, aws, session token": {
        "key": "ASIAEXAMPLE",
        "secret": "s3cr3t",
        "token": "IQoJb3JpZ2luX2VjE/+=token with space",
        "client_kwargs": {"region_name": "eu-west-1"},
    },
    "sigv4, custom endpoint, session token": {
        "key": "AKID",
        "secret": "se/cr+et=",
        "token": "tok/+=",
        "client_kwargs": {"endpoint_url": "http://localhost:8333", "region_name": "us-west-2"},
        "config_kwargs": {"signature_version": "s3v4"},
    },
    "sigv4, aws virtual host": {
        "key": "AKID",
        "secret": "secret",
        "client_kwargs": {"region_name": "eu-central-1"},
        "config_kwargs": {"signature_version": "s3v4", "s3": {"addressing_style": "virtual"}},
    },
    "sigv4, https endpoint on its default port": {
        "key": "AKID",
        "secret": "secret",
        "client_kwargs": {"endpoint_url": "https://minio.example:443", "region_name": "us-east-1"},
        "config_kwargs": {"signature_version": "s3v4"},
    },
}


def _stamp(url: str) -> str:
    """The part of a presigned URL that changes with the clock (its date or expiry)."""
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    return (q.get("X-Amz-Date") or q["Expires"])[0]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_signer_makes_botocores_urls(config: str) -> None:
    options = CONFIGS[config]
    fs = _fs(**options)
    bucket = "my-bucket"
    for key in KEYS:  # each key, signed at the date botocore signed it
        made = fs.url(f"{bucket}/{key}", expires=900)
        signer = presign.Signer.from_url(made, bucket, key, options["secret"])
        assert signer is not None, made
        assert signer.url(key) == made
    for _ in range(5):  # one signer for the bucket's keys (botocore's in the same second)
        made = [fs.url(f"{bucket}/{key}", expires=900) for key in KEYS]
        if len({_stamp(u) for u in made}) == 1:
            break
    signer = presign.Signer.from_url(made[0], bucket, KEYS[0], options["secret"])
    assert signer is not None
    assert [signer.url(key) for key in KEYS] == made


def test_signer_refuses_urls_it_does_not_reproduce() -> None:
    options = CONFIGS["sigv4, custom endpoint, session token"]
    made = _fs(**options).url("b/k.txt", expires=60)
    secret = options["secret"]
    assert presign.Signer.from_url(made, "b", "k.txt", secret) is not None
    assert presign.Signer.from_url(made + "&versionId=3", "b", "k.txt", secret) is None
    assert presign.Signer.from_url(made, "b", "other.txt", secret) is None  # not its key
    assert presign.Signer.from_url("http://h/b/k.txt", "b", "k.txt", secret) is None
    other = presign.Signer.from_url(made, "b", "k.txt", "wrong secret")
    assert other is not None and other.url("k.txt") != made


def _presign_all(fs: Any, paths: list[str]) -> list[str]:
    """The URLs `presign_all` makes for `paths`, none kept from before (file systems of
    the same options are equal, so an earlier test's URLs would be reused)."""
    with ranges._signed_lock:
        ranges._signed.clear()
    ranges.presign_all(fs, paths)
    expires = ranges.presign_seconds()
    with ranges._signed_lock:
        return [ranges._signed[fs, p, expires][0] for p in paths]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_presign_all_asks_botocore_once_per_bucket(config: str) -> None:
    paths = [f"{bucket}/{key}" for bucket in ("bucket-a", "bucket-b") for key in KEYS]
    for _ in range(5):
        fs = _fs(CountingS3, **CONFIGS[config])
        CountingS3.signed = 0
        urls = _presign_all(fs, paths)
        assert CountingS3.signed == 2
        made = [fs.url(p, expires=ranges.presign_seconds()) for p in paths]
        if {_stamp(u) for u in made} == {_stamp(u) for u in urls}:
            break
    assert urls == made


def test_presign_all_falls_back_to_botocore_when_its_check_fails() -> None:
    fs = _fs(CountingS3, **CONFIGS["default scheme, custom endpoint"])
    fs.url("b/k", expires=60)  # the client made with the right secret
    fs.secret = "not the secret the client signs with"
    CountingS3.signed = 0
    urls = _presign_all(fs, [f"b/{key}" for key in KEYS])
    assert CountingS3.signed == len(KEYS)  # every URL by botocore
    for url, key in zip(urls, KEYS):
        assert urllib.parse.urlsplit(url).path == "/b/" + presign.quote_key(key)


def test_urls_chute_signs_are_accepted_by_s3(s3_server: Any) -> None:
    prefix = s3_server.bucket("presigned")
    bucket = prefix[len("s3://") :]
    fs = _fs(CountingS3, **s3_server.options)
    paths = [f"{bucket}/{key}" for key in KEYS]
    for k, p in enumerate(paths):
        fs.pipe_file(p, f"object {k}\n".encode())
    CountingS3.signed = 0
    urls = _presign_all(fs, paths)
    assert CountingS3.signed == 1
    for k, url in enumerate(urls):
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.read() == f"object {k}\n".encode()
