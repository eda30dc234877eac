"""Calls to a remote store: bounded retries of transient failures, and clear errors.

`obstore_failure` names what a request obstore gave up on ended with (obstore retries on
its own, within the deadline); the rest of this module serves fsspec's calls:

A transient failure (a connection refused or reset, a timeout, a 5xx or 429 answer) is retried
`CHUTE_REMOTE_RETRIES` times (default 3) with exponential backoff from 0.1 s, each retry
logged as a warning on the `chute` logger; then `DataError` names the URL, the attempts and
the last error. fsspec file systems may retry on their own first (s3fs tries 5 times):
chute's retries come on top, for what those let through. A missing object raises
`MissingFileError` (a `DataError` and a `FileNotFoundError`), an access refusal a
`DataError` naming the credentials; other errors are re-raised as `DataError` naming the URL.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

from chute._src.core.errors import DataError, MissingFileError

__all__ = ["call", "failure", "is_transient", "max_retries"]

logger = logging.getLogger("chute")
R = TypeVar("R")
_BACKOFF_S = 0.1
_TRANSIENT_ERRNOS = {
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.EPIPE,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.EAGAIN,
}
# Exception classes, by name, that mean "try again" in the clients fsspec uses (botocore,
# aiohttp, requests, google-auth); matched by name so none of them is imported here.
_TRANSIENT_NAMES = {
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "HTTPClientError",
    "ClientConnectionError",
    "ClientConnectorError",
    "ServerDisconnectedError",
    "ClientPayloadError",
    "ServerTimeoutError",
    "IncompleteRead",
    "ResponseParserError",
    "FSTimeoutError",
    "TransportError",
    "RetryError",
}


def max_retries() -> int:
    """`CHUTE_REMOTE_RETRIES` (default 3): retries after a transient failure."""
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


def _status(e: BaseException) -> int:
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata") or {}
        return int(meta.get("HTTPStatusCode") or 0)
    code = getattr(e, "status", None) or getattr(e, "code", None)
    return code if isinstance(code, int) else 0


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in out and len(out) < 10:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def is_transient(e: BaseException) -> bool:
    """Whether `e` (or what caused it) is a failure worth trying again."""
    for x in _chain(e):
        if isinstance(x, FileNotFoundError | PermissionError | IsADirectoryError):
            return False
        if isinstance(x, ConnectionError | TimeoutError):
            return True
        if isinstance(x, OSError) and x.errno in _TRANSIENT_ERRNOS:
            return True
        if type(x).__name__ in _TRANSIENT_NAMES or 500 <= _status(x) < 600 or _status(x) == 429:
            return True
        if any(f" {c} " in f" {x} " or f"({c})" in str(x) for c in ("500", "502", "503", "504")):
            return True
    return False


def failure(url: str, e: BaseException, what: str) -> DataError:
    """The DataError for a failed (non-transient, or out of retries) call on `url`."""
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
        err = DataError(f"{url}: cannot {what} ({type(e).__name__}: {e}); check the URL")
    err.__cause__ = e
    return err


def call(url: str, what: str, fn: Callable[[], R]) -> R:
    """`fn()`, retried on transient failures; other failures become `DataError`."""
    retries = max_retries()
    attempt = 0
    while True:
        try:
            return fn()
        except DataError:
            raise
        except Exception as e:
            if not is_transient(e):
                raise failure(url, e, what) from e
            attempt += 1
            if attempt > retries:
                err = DataError(
                    f"{url}: cannot {what}: {attempt} attempts failed, the last with "
                    f"{type(e).__name__}: {e}; the storage endpoint is unreachable or "
                    "failing: check the endpoint (storage_options=), the network and the "
                    "service, or raise CHUTE_REMOTE_RETRIES"
                )
                raise err from e
            delay = _BACKOFF_S * 2 ** (attempt - 1)
            logger.warning(
                "chute: %s: %s failed (%s: %s); retry %d of %d in %.2f s",
                url,
                what,
                type(e).__name__,
                e,
                attempt,
                retries,
                delay,
            )
            time.sleep(delay)


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
        from chute._src.storage.remote.stores import deadline_s

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
