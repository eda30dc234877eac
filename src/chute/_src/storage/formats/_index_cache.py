"""An offset index built once per data file and cached on disk, trusted only when it proves
it belongs to the file as it is now.

Where caches are kept (`CHUTE_INDEX_CACHE`, read at each use):

- `user` (the default): in the per-user cache directory only: `$CHUTE_CACHE_DIR`, else
  `$XDG_CACHE_HOME/chute`, else `~/.cache/chute`, created 0700 and used only if it is
  owned by the current user and not group- or other-writable (otherwise nothing is
  cached). A cache there is named by a hash of the data file's real path and the kind.
  Nothing is written into the data's folder, so copying or uploading that folder copies
  only the data. A cache an older chute wrote beside the data (`.NAME.KIND.chute-index`)
  is still read when no cache in the user directory is valid; it is never rewritten.
- `beside`: beside the data file (`.NAME.KIND.chute-index`) when the file's directory is
  owned by the current user and its mode lets its owner write; otherwise (a read-only
  directory, another user's directory, or a write there that fails) in the per-user
  directory. A cache beside the data is then read first.
- `off`: no cache of a local file is read or written (as `cache_index=False` on a source).

Cache files in the per-user directory that were last written more than `MAX_AGE_DAYS`
days ago are removed when a new cache is written there, so caches of deleted files do
not pile up (a cache still in use is then built again once).

A cache file is used only if all of these hold; otherwise it is ignored, the index is
rebuilt and a new cache written:

- it is a regular file, opened without following a symlink, owned by the current
  (effective) user and not group- or other-writable;
- its header has this format version and kind, and the data file's device, inode, size,
  mtime and ctime (nanoseconds) and a CRC32C of a content sample (the first and last
  64 KiB and four 4 KiB blocks at positions set by the size). `os.utime` can restore an
  mtime, not a ctime, so an in-place edit is seen even when the size and mtime are kept;
- its body has the length and CRC32C the header gives, and passes the kind's check of
  what the index means (`_index_checks.py`: every span inside the file, in order);
- the caller's own `check`, if any, agrees (ArrayRecord compares a few records with the
  C++ reader, since its index carries the CRCs its reads are checked against).

Caches are written 0600 (only the user who wrote one ever reads it, so no one else needs
to) under a temporary name, then renamed into place. No pickle: a fixed header and a raw
little-endian uint64 array.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import stat
import struct
import time
from collections.abc import Callable

import numpy as np

from chute._src.storage.formats._index_checks import KINDS, index_is_valid
from chute._src.storage.records.checksum import crc32c

__all__ = [
    "MAX_AGE_DAYS",
    "cache_path",
    "cached_index",
    "cached_remote_index",
    "index_cache_mode",
    "user_cache_dir",
]

_MAGIC = b"CHUTEIDX"
_VERSION = 2
# magic, version, kind (16 bytes), device, inode, size, mtime_ns, ctime_ns, sample CRC32C,
# element count, body CRC32C.
_HEADER = struct.Struct("<8sI16sQQQqqIQI")
_EDGE = 64 << 10
_BLOCK = 4 << 10

MAX_AGE_DAYS = 30
_MODES = ("user", "beside", "off")
# The names `_in_user_dir` and `cached_remote_index` give, and their temporary files.
_OURS = re.compile(r"[0-9a-f]{32}\.[a-z0-9-]+\.chute-index(\.[0-9a-f]{8}\.partial)?")

Identity = tuple[int, int, int, int, int, int]


def index_cache_mode() -> str:
    """Where index caches are kept: `CHUTE_INDEX_CACHE` (`user`, `beside` or `off`)."""
    mode = os.environ.get("CHUTE_INDEX_CACHE", "") or "user"
    if mode not in _MODES:
        raise ValueError(
            f"CHUTE_INDEX_CACHE={mode!r} is not one of {', '.join(_MODES)}: use user (the "
            "per-user cache directory, the default), beside (beside each data file) or off"
        )
    return mode


def user_cache_dir(create: bool = True) -> str | None:
    """The per-user cache directory, created 0700 if `create`; None if it is not there or
    not safe (owned by another user, or group- or other-writable)."""
    d = os.environ.get("CHUTE_CACHE_DIR")
    if not d:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "chute")
    try:
        if create:
            os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return d


def cache_path(path: str, kind: str) -> str:
    """The cache file beside `path`."""
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.{kind}.chute-index")


def _beside(path: str, kind: str) -> list[str]:
    """The cache beside the data, if its directory is ours and its owner may write it."""
    with contextlib.suppress(OSError):
        st = os.stat(os.path.dirname(os.path.abspath(path)))
        if st.st_uid == os.geteuid() and st.st_mode & stat.S_IWUSR:
            return [cache_path(path, kind)]
    return []


def _in_user_dir(path: str, kind: str, create: bool) -> list[str]:
    """The cache in the per-user directory (made only when `create`)."""
    user = user_cache_dir(create)
    if user is None:
        return []
    real = os.path.realpath(path).encode("utf-8", "surrogateescape")
    digest = hashlib.blake2b(real + b"\0" + kind.encode(), digest_size=16).hexdigest()
    return [os.path.join(user, f"{digest}.{kind}.chute-index")]


def _identity(path: str) -> Identity:
    """(device, inode, size, mtime_ns, ctime_ns, CRC32C of a content sample) of `path`."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        size = st.st_size
        ranges = [(0, _EDGE), (max(0, size - _EDGE), _EDGE)]
        ranges += [(size * k // 5 // _BLOCK * _BLOCK, _BLOCK) for k in range(1, 5)]
        crc = 0
        for offset, n in ranges:
            crc = crc32c(os.pread(fd, n, offset), crc)
    finally:
        os.close(fd)
    return (st.st_dev, st.st_ino, size, st.st_mtime_ns, st.st_ctime_ns, crc)


def _read_own_file(cpath: str) -> bytes | None:
    """The file's bytes if it is a regular file of ours that no one else can write."""
    try:
        fd = os.open(cpath, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        with open(os.dup(fd), "rb") as f:
            return f.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _load(cpath: str, kind: bytes, ident: Identity) -> np.ndarray | None:
    raw = _read_own_file(cpath)
    if raw is None or len(raw) < _HEADER.size:
        return None
    magic, version, k, dev, ino, size, mtime, ctime, sample, count, crc = _HEADER.unpack_from(raw)
    body = raw[_HEADER.size :]
    ok = (
        magic == _MAGIC
        and version == _VERSION
        and k.rstrip(b"\0") == kind
        and (dev, ino, size, mtime, ctime, sample) == ident
        and len(body) == count * 8
        and crc32c(body) == crc
    )
    if not ok:
        return None
    return np.frombuffer(body, dtype="<u8").astype(np.int64)


def _sweep(directory: str, now: float) -> None:
    """Removes this user's cache files in `directory` last written over `MAX_AGE_DAYS`
    days ago (and temporary files of writes that died); leaves every other file alone."""
    limit = now - MAX_AGE_DAYS * 86400
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for e in entries:
            if not _OURS.fullmatch(e.name):
                continue
            with contextlib.suppress(OSError):
                st = e.stat(follow_symlinks=False)
                partial = e.name.endswith(".partial") and st.st_mtime < now - 3600
                ours = stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
                if ours and (st.st_mtime < limit or partial):
                    os.unlink(e.path)


def _store(cpaths: list[str], kind: bytes, ident: Identity, index: np.ndarray) -> bool:
    body = np.ascontiguousarray(index, dtype="<u8").tobytes()
    header = _HEADER.pack(_MAGIC, _VERSION, kind, *ident, len(body) // 8, crc32c(body))
    for cpath in cpaths:
        tmp = f"{cpath}.{secrets.token_hex(4)}.partial"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:  # a read-only directory: try the next place
            continue
        try:
            with open(fd, "wb") as f:
                f.write(header + body)
            os.replace(tmp, cpath)
            return True
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return False


def cached_index(
    path: str,
    kind: str,
    build: Callable[[], np.ndarray],
    *,
    use_cache: bool = True,
    check: Callable[[np.ndarray], bool] | None = None,
) -> np.ndarray:
    """The int64 array `build()` makes for `path`, from a cache when one proves fresh.

    A cached index is returned flattened; `check(index)`, if given, is one more test a
    cached index must pass (a built one is trusted).
    """
    if kind not in KINDS:
        raise ValueError(
            f"cached_index: kind={kind!r} has no check of what its index means; add one to "
            f"_index_checks.KINDS (known: {sorted(KINDS)})"
        )
    key = kind.encode()[:16]
    mode = index_cache_mode()
    if not use_cache or mode == "off":
        return np.asarray(build(), dtype=np.int64)
    ident = _identity(path)
    beside, user = _beside(path, kind), _in_user_dir(path, kind, create=False)
    for cpath in beside + user if mode == "beside" else user + beside:
        found = _load(cpath, key, ident)
        if (
            found is not None
            and index_is_valid(kind, found, ident[2])
            and (check is None or check(found))
        ):
            return found
    index = np.asarray(build(), dtype=np.int64)
    if _identity(path) == ident:  # the file did not change while it was indexed
        flat = index.ravel()
        if mode != "beside" or not _store(beside, key, ident, flat):
            user = _in_user_dir(path, kind, create=True)
            if _store(user, key, ident, flat):
                _sweep(os.path.dirname(user[0]), time.time())
    return index


def cached_remote_index(
    url: str,
    identity: tuple[int, str],
    kind: str,
    build: Callable[[], np.ndarray],
    *,
    use_cache: bool = True,
) -> np.ndarray:
    """`cached_index` for a remote object: kept in the per-user cache directory, named by
    a hash of the URL and the kind, and trusted only for the object's size and tags as the
    store reports them now (`identity`: ETag, Last-Modified and version, all that the
    store sends; a 128-bit hash of them and the URL is the key), so worker processes and
    later runs do not read the whole object again to index it. An object replaced in
    place changes its Last-Modified (and ETag, if it has one), so its old index is never
    used. Not cached when the store tells nothing but the size (no identity to trust) or
    with `use_cache=False`."""
    if kind not in KINDS:
        raise ValueError(f"cached_remote_index: kind={kind!r} is not one of {sorted(KINDS)}")
    size, tag = identity
    if not use_cache or not tag:
        return np.asarray(build(), dtype=np.int64)
    key = kind.encode()[:16]
    proof = hashlib.blake2b(f"{url}\0{tag}".encode(), digest_size=16).digest()
    high, low = struct.unpack("<QQ", proof)
    ident = (high, low, size, 0, 0, crc32c(proof))
    digest = hashlib.blake2b(f"{url}\0{kind}".encode(), digest_size=16).hexdigest()
    user = user_cache_dir(create=False)
    if user is not None:
        found = _load(os.path.join(user, f"{digest}.{kind}.chute-index"), key, ident)
        if found is not None and index_is_valid(kind, found, size):
            return found
    index = np.asarray(build(), dtype=np.int64)
    user = user_cache_dir(create=True)
    if user is not None:
        _store([os.path.join(user, f"{digest}.{kind}.chute-index")], key, ident, index.ravel())
    return index
