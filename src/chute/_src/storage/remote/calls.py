"""Calls to a remote store: one retry policy (the client library's, configured), and
clear errors.

chute retries nothing itself. Each client retries a transient failure (a connection
refused or reset, a timeout, a 5xx or 429 answer) its own way, `max_retries()` times
(`CHUTE_REMOTE_RETRIES`, default 3): obstore through its `retry_config`
(`stores.py`), s3fs through botocore's `retries` config (`urls.py`; s3fs also tries a
call 5 times on its own when botocore's answer is SlowDown or a broken connection).
fsspec's HTTP file system (aiohttp) has no retries: an http(s) URL read through it
(`CHUTE_REMOTE_HTTP=fsspec`, a URL with a query string) fails at the first failure;
obstore, which reads http(s) URLs by default, retries as above.

What the client gives up on becomes a `DataError` naming the URL: `MissingFileError` (also a
`FileNotFoundError`) for a missing object, a `DataError` naming the credentials for an
access refusal, and the client's own error for the rest (`failure`, `obstore_failure`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from chute._src.core.errors import DataError, MissingFileError
from chute._src.storage.remote.urls import deadline_s, max_retries

__all__ = ["call", "failure", "obstore_failure"]

R = TypeVar("R")


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in out and len(out) < 10:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def failure(url: str, e: BaseException, what: str) -> DataError:
    """The DataError for a call on `url` that fsspec's client failed (after its retries)."""
    if any(isinstance(x, FileNotFoundError) for x in _chain(e)):
        err: DataError = MissingFileError(
            f"{url}: no such object: cannot {what}; check the URL (bucket and key), or "
            "that every file of the dataset was uploaded"
        )
    elif any(
        type(x).__name__ in ("NoCredentialsError", "PartialCredentialsError") for x in _chain(e)
    ):
        err = DataError(
            f"{url}: no credentials for the store: cannot {what}; pass them in "
            "storage_options= (they travel with the source to worker processes), or set the "
            "store's environment variables (AWS_ACCESS_KEY_ID, ...) before any worker starts"
        )
    elif any(isinstance(x, PermissionError) for x in _chain(e)):
        err = DataError(
            f"{url}: access denied: cannot {what}; check the credentials and the "
            "permissions (storage_options=, or the file system's environment variables)"
        )
    else:
        err = DataError(
            f"{url}: cannot {what} ({type(e).__name__}: {e}); check the URL, the endpoint "
            "(storage_options=) and the network. A transient failure was retried by the "
            f"client (CHUTE_REMOTE_RETRIES={max_retries()})"
        )
    err.__cause__ = e
    return err


def call(url: str, what: str, fn: Callable[[], R]) -> R:
    """`fn()` (a call of fsspec's client, which retries on its own); a failure becomes a
    `DataError` naming `url` (`failure`)."""
    try:
        return fn()
    except DataError:
        raise
    except Exception as e:
        raise failure(url, e, what) from e


def obstore_failure(url: str, e: BaseException, what: str) -> DataError:
    """The DataError for a request obstore gave up on (after its own retries, within the
    deadline): a missing object, a refusal, no answer in time, or the store's error."""
    name = type(e).__name__
    first = str(e).strip().split("\n", 1)[0][:300]
    if name == "NotFoundError" or isinstance(e, FileNotFoundError):
        err: DataError = MissingFileError(
            f"{url}: no such object: cannot {what}; check the URL (bucket and key), or "
            "that every file of the dataset was uploaded"
        )
        err.__cause__ = e
        return err
    if what == "find it":  # it may well exist: the failure is in reading it
        what = "read it"
    if name == "NotSupportedError" and "Range request not supported" in str(e):
        err = DataError(
            f"{url}: cannot {what}: the server answers range requests without the range "
            "(not with a 206, as a server without Range support does); serve the files from "
            "a server that supports Range requests, or read them as a stream"
        )
    elif "Requested " in first and ", got " in first:  # obstore: another range came back
        err = DataError(
            f"{url}: cannot {what}: the server answered a range request with another range "
            f"({first}); it mishandles Range requests: serve the files from one that answers "
            "them as HTTP says (RFC 9110), or read them as a stream"
        )
    elif name in ("PermissionDeniedError", "UnauthenticatedError"):
        err = DataError(
            f"{url}: access denied: cannot {what} ({first}); check the credentials and "
            "the permissions (storage_options=, URL credentials, or the store's "
            "environment variables)"
        )
    elif isinstance(e, TimeoutError):
        err = DataError(
            f"{url}: cannot {what}: no complete answer within {deadline_s():g} s; the "
            "store is unreachable, stalled or too slow: check the endpoint and the network, "
            "or raise CHUTE_REMOTE_DEADLINE_S"
        )
    else:
        err = DataError(
            f"{url}: cannot {what} ({name}: {first}); the store refused or failed the "
            "request after retries: check the URL, the endpoint and the storage options"
        )
    err.__cause__ = e
    return err
