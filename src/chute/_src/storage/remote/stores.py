"""Which URLs obstore reads, and the obstore store that serves one.

`s3://`, `gs://`, `az://` (`abfs://`, `abfss://`) and `http(s)://` objects are read
through obstore (the `remote` extra: Python bindings of Rust's `object_store`, which
sends the requests, retries and times them out on its own threads, without the GIL).
Every other protocol (`memory://`, `hf://`, ...) goes through fsspec, and so does a URL
whose storage options name something obstore cannot express (a session object, s3's
`requester_pays`, ...): `located` returns None for those, and the caller uses fsspec.

The user's storage options are written for fsspec (s3fs, gcsfs, adlfs, HTTP), so they
are translated: credentials, endpoints, regions, headers, proxies and certificate checks
carry over; options that only tune fsspec's own caching or pooling are dropped. Without
options each store reads its usual environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`), and
proxies come from `HTTP_PROXY`/`HTTPS_PROXY`/`NO_PROXY` as for any HTTP client. URL
credentials (`http://user:password@host/...`) become a Basic `Authorization` header and
are never shown: `display_url` drops them from every message.

`CHUTE_REMOTE_HTTP=fsspec` sends every URL through fsspec; without obstore installed the
same happens, with a one-line note on the `chute` logger.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from chute._src import process_effects
from chute._src.storage.remote.urls import (
    StorageOptions,
    deadline_s,
    display_url,
    max_retries,
    options_key,
)

__all__ = ["Located", "display_url", "located"]

logger = logging.getLogger("chute")
_SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "http": "http",
    "https": "http",
}
# fsspec options that tune fsspec itself (caches, listings, pools): nothing to carry over.
_FSSPEC_ONLY = {
    "default_block_size",
    "default_fill_cache",
    "default_cache_type",
    "cache_regions",
    "skip_instance_cache",
    "use_listings_cache",
    "listings_expiry_time",
    "max_paths",
    "asynchronous",
    "loop",
    "block_size",
    "simple_links",
    "same_scheme",
    "size_policy",
    "cache_type",
    "max_concurrency",
}
_PROXY_ENV = [
    f"{name}{suffix}" for name in ("http", "https", "all", "no") for suffix in ("_proxy", "_PROXY")
]
_S3_CONFIG_DROPPED = {"max_pool_connections", "retries", "connect_timeout", "read_timeout"}


@dataclass(frozen=True)
class Located:
    """An object obstore reads: its store, its path in the store, and the URL to show."""

    store: Any
    path: str
    shown: str
    kind: str  # "s3", "gcs", "azure" or "http"


_warned = False
_stores: dict[tuple[str, str, str, float, int], Any] = {}  # (kind, base, options, ...)
_lock = threading.Lock()


def _obstore() -> Any:
    global _warned
    try:
        import obstore
    except ImportError:
        if not _warned:
            _warned = True
            logger.info(
                "chute: obstore is not installed: URLs are read through fsspec (slower); "
                "pip install 'chute[remote]'"
            )
        return None
    return obstore


def located(url: str, storage_options: StorageOptions) -> Located | None:
    """The obstore store and path for `url`, or None: read it through fsspec (another
    protocol, options obstore cannot express, obstore missing, or
    `CHUTE_REMOTE_HTTP=fsspec`)."""
    scheme = url.partition("://")[0].lower()
    kind = _SCHEMES.get(scheme)
    if kind is None or os.environ.get("CHUTE_REMOTE_HTTP", "").lower() == "fsspec":
        return None
    opts = dict(storage_options or {})
    if kind == "http":
        split = _http_split(url)
        if split is None:
            return None
        base, path, auth = split
        key_base = base
    else:
        bucket, _, path = url.partition("://")[2].partition("/")
        if not bucket:
            return None
        base, auth, key_base = f"{scheme}://{bucket}", None, f"{kind}://{bucket}"
    if _obstore() is None:
        return None
    deadline, retries = deadline_s(), max_retries()
    proxies = tuple(os.environ.get(name) for name in _PROXY_ENV)  # read when a store is made
    cache_key = (kind, key_base, options_key(opts) + repr(auth) + repr(proxies), deadline, retries)
    with _lock:
        store = _stores.get(cache_key)
    if store is None:
        try:
            store = _make(kind, base, opts, auth, deadline, retries)
        except Exception as e:  # obstore refused the configuration (a bad key file, ...)
            from chute._src.core.errors import DataError

            first = str(e).strip().split("\n", 1)[0][:300]
            raise DataError(
                f"{display_url(url)}: cannot configure the client for it "
                f"({type(e).__name__}: {first}); check the storage options"
            ) from e
        if store is None:
            return None
        process_effects.register_once("remote-stores", after_in_child=_after_fork_in_child)
        with _lock:
            store = _stores.setdefault(cache_key, store)
    return Located(
        store, urllib.parse.unquote(path) if kind == "http" else path, display_url(url), kind
    )


def _http_split(url: str) -> tuple[str, str, str | None] | None:
    """(scheme://host:port, path, Basic credentials or None) of an http(s) URL; None for
    one with a query or fragment (fsspec sends those as they are)."""
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment or not parts.hostname:
        return None
    host = parts.hostname
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    auth = None
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    return f"{parts.scheme.lower()}://{netloc}", parts.path.lstrip("/"), auth


def _client(deadline: float, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "allow_http": True,
        "timeout": timedelta(seconds=deadline),
        "connect_timeout": timedelta(seconds=min(deadline, 10.0)),
        "pool_idle_timeout": timedelta(seconds=20),
    }
    if headers:
        out["default_headers"] = dict(headers)
    return out


def _retry(deadline: float, retries: int) -> dict[str, Any]:
    return {
        "max_retries": retries,
        "retry_timeout": timedelta(seconds=deadline),
        "backoff": {
            "init_backoff": timedelta(seconds=0.1),
            "max_backoff": timedelta(seconds=max(0.1, deadline / 4)),
            "base": 2,
        },
    }


def _make(
    kind: str, base: str, opts: dict[str, Any], auth: str | None, deadline: float, retries: int
) -> Any:
    """The obstore store, or None when `opts` hold something obstore cannot express."""
    import obstore.store

    stores: Any = obstore.store  # options are built as plain dicts, checked by obstore

    client = _client(deadline)
    retry = _retry(deadline, retries)
    opts = {k: v for k, v in opts.items() if k not in _FSSPEC_ONLY}
    if kind == "http":
        headers, proxy = _http_options(opts)
        if headers is None:
            return None
        if auth is not None and not any(k.lower() == "authorization" for k in headers):
            headers["Authorization"] = auth
        client = _client(deadline, headers)
        if proxy:
            client["proxy_url"] = proxy
        return stores.HTTPStore.from_url(base, client_options=client, retry_config=retry)
    if kind == "s3":
        config = _s3_config(opts, client, base.startswith("https"))
        if config is None:
            return None
        return stores.S3Store.from_url(
            base, config=config, client_options=client, retry_config=retry
        )
    if kind == "gcs":
        config = _simple_config(opts, {"token": "google_service_account_path"})
        if config is None:
            return None
        return stores.GCSStore.from_url(
            base, config=config, client_options=client, retry_config=retry
        )
    config = _simple_config(
        opts,
        {
            "account_name": "azure_storage_account_name",
            "account_key": "azure_storage_account_key",
            "sas_token": "azure_storage_sas_key",
        },
    )
    if config is None:
        return None
    return stores.AzureStore.from_url(
        base, config=config, client_options=client, retry_config=retry
    )


def _http_options(opts: dict[str, Any]) -> tuple[dict[str, str] | None, str | None]:
    """(headers, proxy) from fsspec HTTP options (top level, or `client_kwargs`, which
    aiohttp takes); (None, None) when something else is asked for."""
    headers: dict[str, str] = {}
    proxy: str | None = None
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    for source in (opts, client_kwargs):
        for key, value in source.items():
            if key == "headers" and isinstance(value, Mapping):
                headers.update({str(k): str(v) for k, v in value.items()})
            elif key == "proxy" and isinstance(value, str):
                proxy = value
            elif key == "auth" and hasattr(value, "login") and hasattr(value, "password"):
                token = base64.b64encode(f"{value.login}:{value.password}".encode()).decode()
                headers["Authorization"] = f"Basic {token}"
            elif key == "trust_env":
                pass  # proxies from the environment are always honoured
            else:
                return None, None
    return headers, proxy


def _s3_config(opts: dict[str, Any], client: dict[str, Any], https: bool) -> dict[str, Any] | None:
    config: dict[str, Any] = {}
    names = {
        "key": "access_key_id",
        "secret": "secret_access_key",
        "token": "token",
        "aws_access_key_id": "access_key_id",
        "aws_secret_access_key": "secret_access_key",
        "aws_session_token": "token",
        "endpoint_url": "endpoint",
        "region_name": "region",
    }
    client_kwargs = dict(opts.pop("client_kwargs", None) or {})
    config_kwargs = dict(opts.pop("config_kwargs", None) or {})
    verify = client_kwargs.pop("verify", True)
    if verify is False:
        client["allow_invalid_certificates"] = True
    elif verify is not True:
        return None  # a CA bundle path: fsspec
    for source in (opts, client_kwargs):
        for key, value in source.items():
            if key in names and value is not None:
                config[names[key]] = str(value)
            elif key == "anon":
                if value:
                    config["skip_signature"] = True
            elif key == "use_ssl" and value:
                pass
            else:
                return None
    for key, value in config_kwargs.items():
        if key in _S3_CONFIG_DROPPED:
            continue
        if key == "proxies" and isinstance(value, Mapping):
            endpoint = str(config.get("endpoint", ""))
            scheme = "https" if endpoint.startswith("https") or (not endpoint and https) else "http"
            proxy = value.get(scheme) or value.get("https") or value.get("http")
            if proxy:
                client["proxy_url"] = str(proxy)
        elif key == "s3" and isinstance(value, Mapping) and set(value) <= {"addressing_style"}:
            config["virtual_hosted_style_request"] = value.get("addressing_style") == "virtual"
        elif key == "region_name":
            config["region"] = str(value)
        else:
            return None
    if "region" not in config and not os.environ.get("AWS_REGION"):
        region = os.environ.get("AWS_DEFAULT_REGION")
        if region:
            config["region"] = region
    return config


def _simple_config(opts: dict[str, Any], names: dict[str, str]) -> dict[str, Any] | None:
    config: dict[str, Any] = {}
    for key, value in opts.items():
        if key in names and isinstance(value, str):
            config[names[key]] = value
        elif key == "anon" and value:
            config["skip_signature"] = True
        else:
            return None
    return config


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _stores.clear()  # a store's connections and runtime threads belong to the parent
