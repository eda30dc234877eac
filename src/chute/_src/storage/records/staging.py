"""What a write leaves on disk while it runs, and how a later write proves it its own.

Nothing here deletes a file unless it can show chute wrote it and no live writer holds it:

- A temporary file (`.NAME.XXXXXXXX.partial`) is created exclusively and `flock`ed for
  as long as its writer has it open; the lock dies with the process (SIGKILL too). A later
  write removes one only if its name has that pattern, it is a regular file of this user,
  nobody holds its lock, and it starts with the magic bytes of what chute writes there (or
  holds nothing but a beginning of them: a writer killed before its first bytes reached
  the file leaves it empty).
- A sharded write keeps a journal (`.PREFIX.TOKEN.writing`, JSON naming the shard names it
  uses), locked for the writer's life. A dead journal proves which complete shards an
  interrupted write left behind: a later write adopts them (`resume`) or removes them.
- The shards an old manifest lists are removed only if each still has the size and trailer
  CRC32C the manifest records (so a file a user put under that name is never removed).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from chute._src.storage.records.checksum import crc32c
from chute._src.storage.records.layout import HEADER_MAGIC, TRAILER, TRAILER_MAGIC

if TYPE_CHECKING:
    from chute._src.storage.records.manifest import ShardEntry

__all__ = [
    "ARRAY_RECORD_MAGIC",
    "MANIFEST_MAGIC",
    "Journal",
    "create_locked",
    "remove_listed_shard",
    "sweep_temps",
    "temp_name",
]

ARRAY_RECORD_MAGIC = bytes.fromhex("83af70d10d884a3f")  # riegeli's file signature
MANIFEST_MAGIC = b'{\n "format": "chute-records"'
_JOURNAL_FORMAT = "chute-records-write"


def temp_name(path: Path) -> Path:
    """Hidden and without the final suffix: a glob for `*.crec` never picks it up."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.partial")


def temp_pattern(name_regex: str) -> re.Pattern[str]:
    """Matches the temporary names `temp_name` gives files whose name matches `name_regex`."""
    return re.compile(rf"\.(?:{name_regex})\.[0-9a-f]{{8}}\.partial")


def create_locked(path: Path) -> IO[bytes]:
    """Creates `path` (it must not exist) and holds an exclusive `flock` on it until closed."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return os.fdopen(fd, "wb", buffering=1 << 20)


@contextlib.contextmanager
def _dead_own_file(path: Path) -> Iterator[int | None]:
    """Yields a descriptor of `path`, locked, if it is a regular file of this user that no
    live writer holds; else None."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            yield None
            return
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield None  # a live writer holds it
            return
        yield fd
    finally:
        os.close(fd)


def _remove_if_dead(path: Path, magics: tuple[bytes, ...]) -> bool:
    with _dead_own_file(path) as fd:
        if fd is None:
            return False
        head = os.pread(fd, 64, 0)
        # A writer killed before its first buffered bytes reached the file leaves it empty
        # (or holding part of the magic): nothing in it but the start of chute's own output.
        if not any(head.startswith(m) or m.startswith(head) for m in magics):
            return False
        os.unlink(path)
        return True


def sweep_temps(
    directory: Path,
    pattern: re.Pattern[str],
    magics: tuple[bytes, ...],
    protect: frozenset[str] = frozenset(),
) -> None:
    """Removes the temporary files in `directory` that killed chute writers left, except
    those whose real path is in `protect` (the files being read)."""
    try:
        names = [e.name for e in os.scandir(directory)]
    except OSError:
        return
    for name in names:
        if pattern.fullmatch(name) and os.path.realpath(directory / name) not in protect:
            _remove_if_dead(directory / name, magics)


def remove_listed_shard(path: Path, entry: ShardEntry) -> bool:
    """Removes a shard an old manifest listed if it still is the file that manifest
    describes (size and trailer CRC32C); returns whether it did."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size or entry.size < TRAILER.size:
            return False
        with open(path, "rb") as f:
            f.seek(entry.size - TRAILER.size)
            tail = f.read(TRAILER.size)
        (crc,) = struct.unpack("<I", tail[-4:])
        if not tail.startswith(TRAILER_MAGIC) or crc != crc32c(tail[:-4]):
            return False
        if crc != entry.trailer_crc32c:
            return False
        os.unlink(path)
        return True
    except OSError:
        return False


class Journal:
    """The lock file of one sharded write: `.PREFIX.TOKEN.writing`.

    Its JSON names the shard-name suffix the write uses (`""` for `part-00000.crec`, or
    `".TOKEN"` for `part-00000.TOKEN.crec` when plain names are taken; a write with a fixed
    shard count names them `part-00000-of-00004.crec`, `part-00000-of-00004.TOKEN.crec`). It is locked while
    the writer lives and removed when the write commits or is aborted.
    """

    def __init__(self, path: Path, suffix: str, file: IO[bytes]) -> None:
        self.path = path
        self.suffix = suffix
        self._file: IO[bytes] | None = file

    @staticmethod
    def pattern(prefix: str) -> re.Pattern[str]:
        return re.compile(rf"\.{re.escape(prefix)}\.([0-9a-f]{{8}})\.writing")

    @classmethod
    def create(cls, directory: Path, prefix: str, suffix: str) -> Journal:
        token = suffix[1:] if suffix else uuid.uuid4().hex[:8]
        path = directory / f".{prefix}.{token}.writing"
        f = create_locked(path)
        f.write(
            json.dumps({"format": _JOURNAL_FORMAT, "prefix": prefix, "suffix": suffix}).encode()
        )
        f.flush()
        os.fsync(f.fileno())
        return cls(path, suffix, f)

    @classmethod
    def scan(cls, directory: Path, prefix: str) -> tuple[list[Journal], set[str]]:
        """The dead journals in `directory` (now locked by this process), and the suffixes
        live writers use."""
        dead: list[Journal] = []
        live: set[str] = set()
        pattern = cls.pattern(prefix)
        for entry in os.scandir(directory):
            if not pattern.fullmatch(entry.name):
                continue
            path = directory / entry.name
            try:
                st = os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                    continue
                f = open(path, "r+b")  # noqa: SIM115 - kept open to hold the lock
            except OSError:
                continue
            try:
                doc = json.loads(f.read(4096))
                ok = doc.get("format") == _JOURNAL_FORMAT and doc.get("prefix") == prefix
                suffix = str(doc.get("suffix"))
                if not ok or not re.fullmatch(r"(\.[0-9a-f]{8})?", suffix):
                    f.close()
                    continue
            except (ValueError, AttributeError):
                f.close()
                continue
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                live.add(suffix)
                f.close()
                continue
            dead.append(cls(path, suffix, f))
        return dead, live

    def shard_pattern(self, prefix: str) -> re.Pattern[str]:
        # `part-00003.crec`, or `part-00003-of-00016.crec` (a write with a fixed shard count).
        of = r"(?:-of-\d{5})?"
        return re.compile(rf"{re.escape(prefix)}-\d{{5}}{of}{re.escape(self.suffix)}\.crec")

    def remove_files(self, directory: Path, prefix: str, keep: set[str]) -> None:
        """Removes the shards of this (dead or own) write, except those named in `keep`."""
        pattern = self.shard_pattern(prefix)
        for entry in os.scandir(directory):
            if pattern.fullmatch(entry.name) and entry.name not in keep:
                _remove_if_dead(directory / entry.name, (HEADER_MAGIC,))
        self.finish()

    def finish(self) -> None:
        """Removes the journal: the write committed, or left nothing behind."""
        if self._file is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.release()

    def release(self) -> None:
        """Drops the lock and keeps the journal, so a later write can adopt the shards."""
        if self._file is not None:
            self._file.close()
            self._file = None
