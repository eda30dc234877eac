"""Which paths are URLs, and the fsspec file system that serves one.

A path with a scheme (`s3://`, `gs://`, `memory://`, ...) is a URL: read through obstore
where `stores.py` says so (s3, gs, az, http(s)), else through fsspec (the `remote`
extra), imported only when such a path is met. A local path and a `file://` URL are
plain files: chute maps them as before, with neither client involved.

Storage options (credentials, endpoints, ...) reach fsspec two ways: the
`storage_options=` argument of every chute API that takes a path (kept with the source,
so worker processes get them when it is pickled to them), and fsspec's own configuration
(`fsspec.config.conf`, and the `FSSPEC_<PROTOCOL>_<OPTION>` environment variables that
fsspec reads at import, which worker processes inherit). The argument wins.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["StorageOptions", "display_url", "filesystem", "is_url", "local_path", "options_key"]

StorageOptions = Mapping[str, Any] | None
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
# Async S3 clients keep this many connections, so a block of range reads is in flight at
# once (botocore's default is 10); the user's own config_kwargs win.
_S3_POOL = 128


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for a URL that fsspec serves; False for a local path or a `file://` URL.

    >>> is_url("s3://bucket/a.crec"), is_url("/data/a.crec"), is_url("file:///data/a.crec")
    (True, False, False)
    """
    if not isinstance(path, str):
        return False
    m = _SCHEME.match(path)
    return m is not None and m.group(1).lower() not in ("file", "local")


def local_path(path: str | os.PathLike[str]) -> str:
    """`path` as a local path: `file:///x` becomes `/x`; anything else is unchanged.

    >>> local_path("file:///data/a.crec"), local_path("data/a.crec")
    ('/data/a.crec', 'data/a.crec')
    """
    p = os.fspath(path)
    m = _SCHEME.match(p)
    if m is not None and m.group(1).lower() in ("file", "local"):
        return p[m.end() :] or "/"
    return p


def display_url(url: str) -> str:
    """`url` without the password of its credentials (for messages and logs).

    >>> display_url("http://alice:secret@h:80/a b.jsonl")
    'http://alice@h:80/a b.jsonl'
    >>> display_url("s3://bucket/key")
    's3://bucket/key'
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, path = rest.partition("/")
    if "@" not in netloc:
        return url
    userinfo, _, host = netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user + '@' if user else ''}{host}{slash}{path}"


def fsspec_module() -> Any:
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(
            "reading or writing URLs (s3://, gs://, memory://, ...) needs fsspec: "
            "pip install 'chute[remote]', plus the file system's own package (s3fs for "
            "s3://, gcsfs for gs://)"
        ) from e
    return fsspec


def options_key(storage_options: StorageOptions) -> str:
    """A stable text form of storage options (for caches keyed by them)."""
    return repr(sorted((storage_options or {}).items()))


def _with_defaults(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("max_pool_connections", _S3_POOL)
        # botocore's "standard" retries: 5xx, 429, throttling and broken connections, with
        # backoff; the one retry policy (`calls.py`).
        config.setdefault("retries", {"total_max_attempts": max_retries() + 1, "mode": "standard"})
        options["config_kwargs"] = config
    return options


def filesystem(url: str, storage_options: StorageOptions = None) -> tuple[Any, str]:
    """The fsspec file system for `url` and the path within it (fsspec caches instances).

    Raises ImportError naming the package to install when the protocol's implementation
    (s3fs, gcsfs, ...) is missing, and ValueError for a protocol fsspec does not know.
    """
    fsspec = fsspec_module()
    protocol = _SCHEME.match(url).group(1).lower()  # type: ignore[union-attr]
    try:
        cls = fsspec.get_filesystem_class(protocol)
    except ImportError as e:
        raise ImportError(f"{url}: {e}") from e
    except ValueError as e:
        raise ValueError(
            f"{url}: fsspec knows no file system for {protocol}://; check the URL, or "
            "install the package that registers it"
        ) from e
    options = _with_defaults(protocol, dict(storage_options or {}))
    fs = fsspec.filesystem(protocol, **options)
    return fs, cls._strip_protocol(url)


def to_url(fs: Any, path: str) -> str:
    """`path` of `fs` (as fsspec's glob returns it) as a full URL."""
    out: str = fs.unstrip_protocol(path)
    return out


_DEADLINE_S = 60.0  # CHUTE_REMOTE_DEADLINE_S's default


def max_retries() -> int:
    """`CHUTE_REMOTE_RETRIES` (default 3): the client's retries after a transient failure."""
    raw = os.environ.get("CHUTE_REMOTE_RETRIES", "3")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(
            f"CHUTE_REMOTE_RETRIES={raw!r} is not an integer; set it to the number of "
            "retries after a transient error (0 or more)"
        ) from None
    if n < 0:
        raise ValueError(f"CHUTE_REMOTE_RETRIES={n} is negative; set it to 0 or more")
    return n


def deadline_s() -> float:
    """`CHUTE_REMOTE_DEADLINE_S` (default 60): the longest one read (a batch of ranges, a
    first block, a listing) may take, retries included, before it is a `DataError`."""
    raw = os.environ.get("CHUTE_REMOTE_DEADLINE_S", str(_DEADLINE_S))
    try:
        s = float(raw)
    except ValueError:
        raise ValueError(
            f"CHUTE_REMOTE_DEADLINE_S={raw!r} is not a number; set it to the seconds one "
            "remote read may take (default 60)"
        ) from None
    if not s > 0:
        raise ValueError(f"CHUTE_REMOTE_DEADLINE_S={raw} must be above 0; default 60")
    return s
