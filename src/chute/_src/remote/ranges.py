"""Byte-range GETs over pooled keep-alive HTTP/1.1 connections, with little CPU each.

fsspec's S3 client (s3fs over aiobotocore) spends milliseconds of CPU on every request
(building it, signing it with SigV4, parsing the answer through botocore's layers); a
random read of a small record is one request, so that cost is the rate. For objects it
applies to (`target`), chute reads ranges itself instead:

- `s3://`: the object is located once by a presigned GET URL, made by the s3fs file
  system the user's storage options built (its credentials, endpoint and region), renewed
  before it expires and on a 403 answer; `http(s)://`: the URL itself.
- `fetch` sends `Range:` GETs on connections taken from the endpoint's pool (opened
  without blocking, TLS included), many in flight, and waits for the answers with one
  `epoll` loop (`wire.py`) on the calling thread: no thread, no event loop, one `send` and
  usually one `recv` per request. Several threads may fetch at once, each with its own
  connections.
- An answer must be `206` with the `Content-Range` asked for, the object's size and its
  ETag from when it was opened: otherwise a `DataError` names the URL (the object was
  replaced). A connection the server closes after each answer (or before a reused one is
  written to) is replaced; 5xx and 429 answers, resets and timeouts are transient errors
  for `calls.py`'s bounded retries; 404 is a missing object, a 403 on a fresh URL is a
  refusal.

Connections stay open while a `Target` of their endpoint lives (an open remote file, or an
object found and not opened yet: `file.find_objects`), up to `_IDLE_S` idle, and are closed
when the last one goes. `CHUTE_REMOTE_HTTP=fsspec` reads through fsspec instead.
"""

from __future__ import annotations

import collections
import errno
import os
import socket
import ssl
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from chute._src.remote import wire
from chute._src.remote.wire import Conn

__all__ = ["Target", "fetch", "presign_all", "target", "target_protocol"]

_MAX_CONNS = 256  # open connections per endpoint (a call may go over by one)
_IDLE_S = 20.0  # an idle connection older than this is closed, not reused
_PRESIGN_S = 3600  # lifetime asked for a presigned URL (CHUTE_REMOTE_PRESIGN_S)


class Endpoint:
    """The pool of connections to one `scheme://host:port`; closed when unreferenced."""

    def __init__(self, scheme: str, host: str, port: int, context: ssl.SSLContext | None):
        self.host, self.port, self.context = host, port, context
        self.netloc = host if port == (443 if scheme == "https" else 80) else f"{host}:{port}"
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.opened = 0
        self.idle: list[Conn] = []
        self.address: tuple[int, Any] | None = None
        self.resolved_at = 0.0
        weakref.finalize(self, _close_all, self.idle)

    def take(self, n: int) -> tuple[list[Conn], int]:
        """Up to `n` idle connections, and how many more may be opened (at least one
        when none is idle)."""
        now = time.monotonic()
        with self.lock:
            if self.pid != os.getpid():  # forked: the parent's connections are not ours
                self.pid, self.opened = os.getpid(), 0
                _close_all(self.idle)
            out: list[Conn] = []
            while self.idle and len(out) < n:
                c = self.idle.pop()
                if now - c.last > _IDLE_S:
                    c.close()
                    self.opened -= 1
                else:
                    out.append(c)
            more = max(0, min(n - len(out), _MAX_CONNS - self.opened))
            if not out and not more:
                more = 1
            self.opened += more
            return out, more

    def give(self, conns: list[Conn], opened_not_returned: int) -> None:
        with self.lock:
            if self.pid != os.getpid():
                _close_all(conns)
                return
            self.opened -= opened_not_returned
            for c in conns:
                c.reused, c.last = True, time.monotonic()
            self.idle.extend(conns)

    def _address(self) -> tuple[int, Any]:
        """(family, address) of the host, looked up again after `_IDLE_S`."""
        now = time.monotonic()
        if self.address is None or now - self.resolved_at > _IDLE_S:
            family, _, _, _, addr = socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM
            )[0]
            self.address, self.resolved_at = (family, addr), now
        return self.address

    def connect(self) -> Conn:
        """A new connection, being opened (without blocking, once the name is known)."""
        family, addr = self._address()
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            err = sock.connect_ex(addr)
            if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
                raise ConnectionRefusedError(err, f"{os.strerror(err)}: {self.netloc}")
        except BaseException:
            sock.close()
            raise
        return Conn(sock)


def _close_all(conns: list[Conn]) -> None:
    for c in conns:
        c.close()
    conns.clear()


_endpoints: weakref.WeakValueDictionary[tuple[Any, ...], Endpoint] = weakref.WeakValueDictionary()
_endpoints_lock = threading.Lock()
_targets: weakref.WeakSet[Target] = weakref.WeakSet()
_SIGNED_MAX = 4096  # presigned URLs kept for reuse (`_presigned`)
_signed: collections.OrderedDict[tuple[Any, str, int], tuple[str, float]] = (
    collections.OrderedDict()
)
_signed_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A thread of the parent may have held a lock when it forked: new ones here (the
    parent's connections are dropped by `Endpoint.take`, which sees the new pid)."""
    global _endpoints_lock, _signed_lock
    _endpoints_lock = threading.Lock()
    _signed_lock = threading.Lock()
    for ep in list(_endpoints.values()):
        ep.lock = threading.Lock()
    for t in list(_targets):
        t._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _endpoint(url: str, verify: Any) -> tuple[Endpoint, str]:
    """The pool for `url`'s host, and the request target (path and query)."""
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    host = u.hostname or ""
    if scheme not in ("http", "https") or not host:
        raise ValueError(f"{url!r}: not an http(s) URL")
    port = u.port or (443 if scheme == "https" else 80)
    key = (scheme, host, port, repr(verify))
    with _endpoints_lock:
        ep = _endpoints.get(key)
        if ep is None:
            context = None
            if scheme == "https":
                cafile = verify if isinstance(verify, str) else None
                context = ssl.create_default_context(cafile=cafile)
                if verify is False:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
            ep = Endpoint(scheme, host, port, context)
            _endpoints[key] = ep
    path = u.path or "/"
    return ep, path + (f"?{u.query}" if u.query else "")


class Target:
    """One object as `fetch` reads it: where to GET it (`locate(fresh)`, renewed after
    `expires_s` when it is presigned) and what it was when opened (size, ETag). A
    `size` of -1 is not known yet: the first answer tells it (`wire.check`), with the
    ETag, so opening an object costs one GET of its first bytes and no HEAD."""

    def __init__(
        self,
        url: str,
        size: int,
        etag: str,
        locate: Callable[[bool], tuple[str, float]],
        expires_s: float | None,
        verify: Any = True,
    ) -> None:
        self.url, self.size, self.etag = url, size, wire.etag_value(etag)
        self.renewable = expires_s is not None
        self._locate, self._expires_s, self._verify = locate, expires_s, verify
        self._lock = threading.Lock()
        self.endpoint: Endpoint
        self.signed_at = self.renew_at = 0.0
        self.prefix = b""
        self.renew(fresh=False)
        _targets.add(self)

    def renew(self, if_signed_before: float | None = None, *, fresh: bool = True) -> None:
        """Locates the object again (a fresh presigned URL), unless that was done since
        `if_signed_before`; `fresh=False` takes a recent one made for the same object."""
        with self._lock:
            if if_signed_before is not None and self.signed_at > if_signed_before:
                return
            located, self.signed_at = self._locate(fresh)
            self.endpoint, target = _endpoint(located, self._verify)
            self.renew_at = (
                self.signed_at + 0.75 * self._expires_s if self._expires_s else float("inf")
            )
            self.prefix = (
                f"GET {target} HTTP/1.1\r\nHost: {self.endpoint.netloc}\r\n"
                "User-Agent: chute\r\nAccept-Encoding: identity\r\nRange: bytes="
            ).encode("latin-1")

    def request(self, a: int, b: int) -> bytes:
        if time.monotonic() > self.renew_at:
            self.renew(if_signed_before=self.renew_at - 0.75 * (self._expires_s or 0))
        return self.prefix + b"%d-%d\r\n\r\n" % (a, b - 1)


def presign_seconds() -> int:
    """`CHUTE_REMOTE_PRESIGN_S` (default 3600): how long a presigned URL is asked to last."""
    raw = os.environ.get("CHUTE_REMOTE_PRESIGN_S", str(_PRESIGN_S))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(
            f"CHUTE_REMOTE_PRESIGN_S={raw!r} is not a positive integer; set it to the "
            "seconds a presigned URL lasts (default 3600)"
        )
    return n


def _presigned(fs: Any, path: str, expires: int, fresh: bool) -> tuple[str, float]:
    """A presigned GET URL of `path` and when it was made: one made in the last quarter
    of its lifetime for the same object through the same file system, unless `fresh`
    (signing costs the s3 client a millisecond of CPU; listing a dataset, then opening
    each of its objects, would sign each twice)."""
    key = (fs, path, expires)
    now = time.monotonic()
    with _signed_lock:
        got = _signed.get(key)
        if got is not None and not fresh and now - got[1] < 0.25 * expires:
            _signed.move_to_end(key)
            return got
    located: str = fs.url(path, expires=expires)
    _keep_signed([(key, located)], now)
    return located, now


def _keep_signed(signed: Sequence[tuple[tuple[Any, str, int], str]], now: float) -> None:
    """Keeps presigned URLs (by file system, path, lifetime), the oldest dropped first."""
    with _signed_lock:
        for key, url in signed:
            _signed[key] = (url, now)
            _signed.move_to_end(key)
        while len(_signed) > _SIGNED_MAX:
            _signed.popitem(last=False)


def presign_all(fs: Any, paths: Sequence[str]) -> None:
    """Presigns `paths` of the s3 file system `fs` in one call to its event loop (the
    URLs kept for `target`), rather than one call, and one thread hop, each. botocore
    signs each bucket's first key; its other keys are signed by `presign.Signer` when
    that reproduces botocore's first URL exactly, else by botocore too."""
    expires = presign_seconds()
    now = time.monotonic()
    with _signed_lock:
        todo = [
            p
            for p in dict.fromkeys(paths)
            if (got := _signed.get((fs, p, expires))) is None or now - got[1] >= 0.25 * expires
        ]
    if len(todo) < 2 or not hasattr(fs, "_url") or not hasattr(fs, "split_path"):
        return
    import asyncio

    from fsspec.asyn import sync

    from chute._src.remote import presign

    async def botocore(ks: list[int]) -> list[str]:
        return list(await asyncio.gather(*(fs._url(todo[k], expires=expires) for k in ks)))

    async def sign_all() -> list[str]:
        parts = [fs.split_path(p) for p in todo]
        first: dict[str, int] = {}
        head = [k for k, (b, _, v) in enumerate(parts) if v or first.setdefault(b, k) == k]
        out = dict(zip(head, await botocore(head)))
        signers: dict[str, presign.Signer] = {}
        for bucket, k in first.items():
            made, key = out[k], parts[k][1]
            access_key = presign.access_key_of(made)
            secret = await presign.session_secret(fs, access_key) if access_key else None
            signer = presign.Signer.from_url(made, bucket, key, secret) if secret else None
            if signer is not None and signer.url(key) == made:
                signers[bucket] = signer
        rest = [k for k in range(len(todo)) if k not in out]
        for k in rest:
            signer = signers.get(parts[k][0])
            if signer is not None:
                out[k] = signer.url(parts[k][1])
        theirs = [k for k in rest if k not in out]
        out.update(zip(theirs, await botocore(theirs)))
        return [out[k] for k in range(len(todo))]

    located = sync(fs.loop, sign_all)
    _keep_signed([((fs, p, expires), url) for p, url in zip(todo, located)], now)


def target_protocol(fs: Any) -> str | None:
    """ "s3" or "http" when `fetch` reads `fs`'s objects (s3fs without request options
    that a presigned GET cannot carry; fsspec's http), else None: fsspec reads them."""
    if os.environ.get("CHUTE_REMOTE_HTTP", "").lower() == "fsspec":
        return None
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("s3", "s3a"):
        if getattr(fs, "s3_additional_kwargs", None) or getattr(fs, "req_kw", None):
            return None  # server-side encryption keys, requester pays: signed headers
        return "s3"
    if protocol in ("http", "https"):
        return "http"
    return None


def target(url: str, fs: Any, path: str, size: int = -1, etag: str = "") -> Target | None:
    """A `Target` for the object `path` of `fs` when chute can read it with `fetch`
    (`target_protocol`), else None. `size` -1: learnt from the first answer, with the
    ETag."""
    protocol = target_protocol(fs)
    if protocol == "s3":
        expires = presign_seconds()
        verify = (getattr(fs, "client_kwargs", None) or {}).get("verify", True)

        def locate(fresh: bool) -> tuple[str, float]:
            return _presigned(fs, path, expires, fresh)

        return Target(url, size, etag, locate, expires, verify)
    if protocol == "http":
        return Target(url, size, etag, lambda fresh: (path, time.monotonic()), None)
    return None


def fetch(requests: Sequence[tuple[Target, int, int]]) -> list[Any]:
    """One try at each `(target, start, end)`: its bytes, or the exception that failed it
    (transient ones for the caller to retry)."""
    call = wire.Call(requests)
    try:
        call.run()
    finally:
        call.finish()
    return call.out
