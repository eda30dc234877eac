"""Presigning many S3 GET URLs of one bucket with little CPU each, checked against botocore.

botocore presigns a URL in about a millisecond of CPU (building a request through its
event hooks, then signing it); a dataset of thousands of objects pays that once per
object. A presigned GET is a short string signed with the caller's secret: SigV4 query
auth (HMAC-SHA256 over a canonical request) or S3's older query auth (HMAC-SHA1,
"SigV2", what botocore makes where no signature version is configured). Within one call
every URL of a bucket carries the same query (credential, date, lifetime, session token)
but its path and signature, so:

- botocore presigns the first key (`fs._url`: the credentials, region, endpoint,
  addressing style and signature version the s3fs file system resolved);
- `Signer.from_url` takes that URL as the template (its scheme, host, query and the
  path before the key) and the secret of the same access key (s3fs's `secret`, or its
  session's credentials: public APIs);
- `Signer.url` signs the first key again; only when its URL is the one botocore made,
  character for character, does it sign the bucket's other keys. Any configuration it
  does not reproduce (a version id, another signature scheme, other signed headers) is
  never signed wrong, only by botocore.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import urllib.parse
from typing import Any

__all__ = ["Signer", "access_key_of", "session_secret"]

_V4 = "AWS4-HMAC-SHA256"


def quote_key(key: str) -> str:
    """An S3 key as botocore puts it in a URL path (UTF-8, '/' and '~' kept)."""
    return urllib.parse.quote(key, safe="/~")


class Signer:
    """Presigned GET URLs of keys of one bucket, made like a template URL botocore signed."""

    def __init__(
        self,
        version: int,
        base: str,
        prefix: str,
        pairs: list[tuple[str, str]],
        secret: str,
        bucket: str,
    ) -> None:
        self.version, self.base, self.prefix = version, base, prefix
        self.pairs, self.bucket = pairs, bucket  # the query, raw: (name, encoded value)
        name = "X-Amz-Signature" if version == 4 else "Signature"
        self.at = [n for n, _ in pairs].index(name)
        rest = [p for k, p in enumerate(pairs) if k != self.at]
        if version == 4:
            values = dict(rest)
            self.date = values["X-Amz-Date"]
            scope = urllib.parse.unquote(values["X-Amz-Credential"]).split("/", 1)[1]
            day, region, service, _ = scope.split("/")
            key = ("AWS4" + secret).encode()
            for part in (day, region, service, "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            self.key = key
            self.scope = scope
            self.query = "&".join(f"{k}={v}" for k, v in sorted(rest))
            netloc = urllib.parse.urlsplit(base).netloc
            self.host = _canonical_host(base, netloc)
        else:
            values = dict(rest)
            self.key = secret.encode()
            self.expires = values["Expires"]
            token = values.get("x-amz-security-token")
            self.token_line = (
                f"x-amz-security-token:{urllib.parse.unquote(token)}\n" if token else ""
            )

    @classmethod
    def from_url(cls, url: str, bucket: str, key: str, secret: str) -> Signer | None:
        """A signer shaped like `url` (botocore's presigned GET of `key` in `bucket`),
        or None when `url` is not a shape it signs."""
        u = urllib.parse.urlsplit(url)
        if u.fragment or not u.query:
            return None
        pairs = [(n, v) for n, _, v in (p.partition("=") for p in u.query.split("&"))]
        names = {n for n, _ in pairs}
        if len(names) != len(pairs):
            return None
        values = dict(pairs)
        if "X-Amz-Signature" in names:
            if values.get("X-Amz-Algorithm") != _V4 or values.get("X-Amz-SignedHeaders") != "host":
                return None
            if not {"X-Amz-Date", "X-Amz-Credential"} <= names:
                return None
            allowed = {"X-Amz-Security-Token", "X-Amz-Expires", "X-Amz-Signature"}
            version = 4
        elif {"Signature", "AWSAccessKeyId", "Expires"} <= names:
            allowed = {"Signature", "AWSAccessKeyId", "Expires", "x-amz-security-token"}
            version = 2
        else:
            return None
        if any(not n.startswith("X-Amz-") and n not in allowed for n in names):
            return None  # a version id, response overrides, ...: signed resources
        quoted = quote_key(key)
        if not key or not u.path.endswith(quoted):
            return None
        prefix = u.path[: len(u.path) - len(quoted)]
        try:
            return cls(version, f"{u.scheme}://{u.netloc}", prefix, pairs, secret, bucket)
        except (KeyError, ValueError):
            return None

    def url(self, key: str) -> str:
        """The presigned GET URL of `key`."""
        path = self.prefix + quote_key(key)
        if self.version == 4:
            request = f"GET\n{path}\n{self.query}\nhost:{self.host}\n\nhost\nUNSIGNED-PAYLOAD"
            digest = hashlib.sha256(request.encode()).hexdigest()
            text = f"{_V4}\n{self.date}\n{self.scope}\n{digest}"
            signature = hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()
        else:
            resource = f"/{self.bucket}/{quote_key(key)}"
            text = f"GET\n\n\n{self.expires}\n{self.token_line}{resource}"
            mac = hmac.new(self.key, text.encode(), hashlib.sha1).digest()
            signature = base64.b64encode(mac).decode()
        pairs = list(self.pairs)
        pairs[self.at] = (pairs[self.at][0], urllib.parse.quote(signature, safe="-_.~"))
        return f"{self.base}{path}?" + "&".join(f"{n}={v}" for n, v in pairs)


def access_key_of(url: str) -> str | None:
    """The access key a presigned URL names, or None."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    if "AWSAccessKeyId" in query:
        return query["AWSAccessKeyId"][0]
    if "X-Amz-Credential" in query:
        return query["X-Amz-Credential"][0].split("/", 1)[0]
    return None


def _canonical_host(base: str, netloc: str) -> str:
    """The Host a request to `base` sends, as SigV4 signs it (no default port)."""
    scheme = base.split(":", 1)[0]
    default = ":443" if scheme == "https" else ":80"
    return netloc[: -len(default)] if netloc.endswith(default) else netloc


async def session_secret(fs: Any, access_key: str) -> str | None:
    """The secret key s3fs's file system `fs` signs with when its access key is
    `access_key` (the one given in its storage options, else its session's
    credentials), or None when that is not known."""
    if getattr(fs, "key", None) or getattr(fs, "secret", None):
        secret = getattr(fs, "secret", None)
        return secret if fs.key == access_key and isinstance(secret, str) else None
    session = getattr(fs, "session", None)
    if session is None:
        return None
    credentials = await session.get_credentials()
    if credentials is None:
        return None
    frozen = await credentials.get_frozen_credentials()
    if frozen.access_key != access_key or not isinstance(frozen.secret_key, str):
        return None
    out: str = frozen.secret_key
    return out
