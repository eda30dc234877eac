"""`IterDataset.cache(path)`: the first full pass is written to a record file; later passes
(and later runs) read it instead of computing the pipeline above.

The cache directory is `path/<key>`, where the key hashes the upstream pipeline: its
stages and parameters, the code of its functions, and what its sources say about
themselves (their `repr`, which for file sources names the files; for an in-memory list,
its length and a sample of its elements). A different pipeline therefore gets its own cache and builds it;
a cache is never reused for a pipeline it was not written by. Elements are stored with
`chute._src.core.tree_codec` (a JSON header and raw buffers, no pickle) in a `.crec` file
written by `chute.records.RecordWriter`, which appears under its name only when the pass
that wrote it ended: an interrupted pass leaves no cache.

What is trusted: a cache file is read only if its directory (`path/<key>`, made 0700) and
the file (made 0600) are owned by the current user and not group- or other-writable, the
file is a regular file (not a symlink), its metadata names this cache format and the
pipeline's key, and the record file's own checks pass on open (header, trailer, index,
metadata CRC32C) and on every read (each record's CRC32C). A chute record file that fails
is not read: the pass is computed and the cache rewritten. A file chute did not write (it
does not start with a record file's magic, or is not a regular file) is never read,
replaced or deleted: `cache` raises an error naming it. A directory that is not safe is
not written to either: the pipeline runs uncached, with a warning.

State: the position in the stream, whether it was being read from the cache, and the
parent's state; a state taken while reading the cache restores into a process where the
cache exists by position alone. A pass read from the cache after a `repeat` rewound it
leaves the parent where it was (restoring it would start its read-ahead again, an
interleave's or a prefetch's threads reading the source for nothing); the state reports
the parent's state the rewind gave.
"""

from __future__ import annotations

import hashlib
import os
import stat
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from chute._src.core import contract, provenance
from chute._src.core.dataset import IterDataset
from chute._src.core.errors import DataError
from chute._src.core.iterator import DatasetIterator, bad_value, check_int, check_state
from chute._src.core.node import _Node, walk
from chute._src.core.tree_codec import decode, encode
from chute._src.ops.cache import check_pass_position
from chute._src.storage.remote.urls import is_url, local_path

T = TypeVar("T")

_FILE = "elements.crec"
_RECORD_MAGIC = b"CHUTEREC"
_FORMAT = "chute-disk-cache"
_VERSION = 1


def _metadata(key: str) -> dict[str, Any]:
    """What a cache file's metadata must hold: the format and the pipeline's key."""
    return {"chute_cache": key, "format": _FORMAT, "version": _VERSION}


def _is_own(path: Path, kind: int) -> bool:
    """Whether `path` (not followed if a symlink) is of `kind`, ours, writable only by us."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _written_by_chute(file: Path) -> bool | None:
    """None if nothing is at `file`; whether it is a regular file with a record file's magic."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:  # a symlink, or a file this user cannot read
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, 8, 0) == _RECORD_MAGIC
    finally:
        os.close(fd)


def _remote_written_by_chute(url: str, storage: Mapping[str, Any] | None) -> bool | None:
    """`_written_by_chute` for a URL: None if no object is there; whether it has the magic."""
    from chute._src.core.errors import MissingFileError
    from chute._src.storage.remote.file import RemoteFile

    try:
        f = RemoteFile(url, storage, "a chute cache file")
    except MissingFileError:
        return None
    return f.size >= 8 and f[0:8] == _RECORD_MAGIC


def cache_key(ds: _Node) -> str:
    """A hash of everything that decides `ds`'s elements (not thread or worker counts): each
    node's type and `cache_identity()`, through the node protocol (`parents`)."""
    h = hashlib.blake2b(digest_size=12)
    position: dict[int, int] = {}
    for k, node in enumerate(walk(ds)):  # sources first; each names its parents' positions
        position[id(node)] = k
        h.update(type(node).__qualname__.encode())
        for name, value in sorted(contract.cache_identity(node).items()):
            h.update(name.encode())
            h.update(_describe(value).encode())
        h.update(str([position[id(p)] for p in node.parents]).encode())
    return h.hexdigest()


def _code_of(value: Any) -> Any:
    """The code object of a function, or of a transform object's method."""
    if hasattr(value, "__code__"):
        return value.__code__
    for name in ("map", "random_map", "filter", "flat_map", "__call__"):
        method = getattr(type(value), name, None)
        if hasattr(method, "__code__"):
            return method.__code__  # type: ignore[union-attr]
    return None


def _describe(value: Any) -> str:
    if isinstance(value, _Node):
        return type(value).__name__
    code = _code_of(value)
    if code is not None:
        consts = [c for c in code.co_consts if not hasattr(c, "co_code")]
        return f"code:{code.co_code.hex()}:{consts!r}:{code.co_names}"
    if isinstance(value, int | float | str | bytes | bool | type(None)):
        return repr(value)
    if isinstance(value, list | tuple):
        # An in-memory source: its length and a sample of its elements (cheap for any size).
        step = max(1, len(value) // 16)
        return f"{type(value).__name__}[{len(value)}]:{[value[i] for i in range(0, len(value), step)]!r}"
    if isinstance(value, dict | set) or type(value).__name__.endswith("Options"):
        return type(value).__name__  # memo tables; thread and worker counts
    text = repr(value)
    if " at 0x" in text:  # an object without a repr of its own: its type says what it is
        return type(value).__qualname__ + str(getattr(value, "__len__", lambda: "")())
    return text


class DiskCacheIterDataset(IterDataset[T]):
    """Writes the stream's first full pass under `path`, reads later passes from there.

    >>> import chute, tempfile
    >>> calls = []
    >>> ds = chute.MapDataset.range(3).to_iter_dataset().map(lambda x: calls.append(x) or x * 2)
    >>> cached = ds.cache(tempfile.mkdtemp())
    >>> list(cached.repeat(2)), len(calls)
    ([0, 2, 4, 0, 2, 4], 3)
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(
        self,
        parent: IterDataset[T],
        path: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__([parent])
        if not isinstance(path, str | os.PathLike):
            raise TypeError(
                f"cache: path={path!r} is invalid: pass a directory (str or Path) to hold the "
                "cache, or no path for an in-memory cache."
            )
        self._url = str(path).rstrip("/") if is_url(path) else None
        self._storage = dict(storage_options or {})
        self._root = Path(local_path(path)) if self._url is None else Path(".")
        self._key = cache_key(parent)

    @property
    def directory(self) -> Path:
        """Where this pipeline's cache lives: `path/<key of the upstream pipeline>` (for a
        URL, `location` says where)."""
        return self._root / self._key

    @property
    def location(self) -> str:
        """The cache's directory: `directory`, or for a URL `URL/<key>`."""
        return f"{self._url}/{self._key}" if self._url is not None else str(self.directory)

    def _make_iterator(self) -> DatasetIterator[T]:
        if self._url is not None:
            return _DiskCacheIterator(
                self._parent_iter(), f"{self.location}/{_FILE}", self._storage
            )
        return _DiskCacheIterator(self._parent_iter(), self.directory / _FILE)

    def __repr__(self) -> str:
        return f"DiskCacheIterDataset(key={self._key})"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        return provenance.same_position(position)  # the same elements, kept


class _DiskCacheIterator(DatasetIterator[T]):
    stage = "disk_cache"

    def __init__(
        self,
        parent: DatasetIterator[T],
        file: Path | str,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(parent)
        self._file = file  # a str: a URL
        self._storage = storage_options
        self._start = parent.get_state()
        self._source: Any = None  # the cache, once it exists
        self._len = 0
        self._writer: Any = None
        self._written = 0
        self._pos = 0
        self._may_write = True  # this pass started at the beginning
        # Restored from a state that read the parent, now served from the cache: the parent
        # is at this position until the next element (so the state restored is given back).
        self._parent_at: int | None = None
        # Rewound to the pass's start (a `repeat`) while the cache serves it: the parent's
        # state as the state reports it; the parent stays where it was, never read (its
        # restore would start its read-ahead again: an interleave's or a prefetch's threads).
        self._parent_state: Any = None

    def _open_cache(self) -> bool:
        """Opens the cache if it is there and passes every check (see the module doc)."""
        if self._source is not None:
            return True
        file = self._file
        if isinstance(file, str):
            return self._open_remote_cache(file)
        found = _written_by_chute(file)
        if found is None:
            return False
        if not found:
            raise FileExistsError(
                f"cache: {file} exists and was not written by chute (it is not a regular file "
                "starting with a chute record file's magic); chute never reads, replaces or "
                "deletes such a file: move it away, or give .cache() another directory"
            )
        if not (_is_own(file.parent, stat.S_IFDIR) and _is_own(file, stat.S_IFREG)):
            return False  # not provably ours: recompute (and rewrite, if the directory is safe)
        from chute._src.storage.formats.crec import RecordFileDataSource

        source = RecordFileDataSource(str(file))
        try:
            ok = source.metadata == _metadata(file.parent.name)
        except DataError:
            ok = False
        if not ok:
            source.close()
            return False
        self._source = source
        self._len = len(source)
        return True

    def _open_remote_cache(self, url: str) -> bool:
        """`_open_cache` for a URL: the bucket's permissions are the trust boundary (there
        is no owner or mode to check); the object must be a chute record file whose
        metadata names this pipeline's key, and passes the record file's checks."""
        from chute._src.storage.formats.crec import RecordFileDataSource

        found = _remote_written_by_chute(url, self._storage)
        if found is None:
            return False
        if not found:
            raise FileExistsError(
                f"cache: {url} exists and was not written by chute (it does not start with a "
                "chute record file's magic); chute never reads, replaces or deletes such an "
                "object: move it away, or give .cache() another location"
            )
        try:
            source = RecordFileDataSource(url, storage_options=self._storage)
            ok = source.metadata == _metadata(url.rsplit("/", 2)[-2])
        except DataError:
            return False
        if not ok:
            return False
        self._source = source
        self._len = len(source)
        return True

    def __next__(self) -> T:
        if self._writer is None and self._pos == 0 and self._may_write:
            if self._open_cache():
                self._may_write = False
            else:
                self._start_writer()
        if self._source is not None and not self._may_write:
            if self._pos >= self._len:
                raise StopIteration
            try:
                record = self._source[self._pos]
            except DataError as e:
                e.add_note(
                    f"chute: the disk cache {self._file} is corrupt; delete it and the next "
                    "pass rebuilds it"
                )
                raise
            self._pos += 1
            return decode(record)
        try:
            x = next(self._parent)
        except StopIteration:
            self._finish()
            raise
        if self._writer is not None and self._written == self._pos:
            self._writer.write(encode(x))
            self._written += 1
        self._pos += 1
        return x

    def _start_writer(self) -> None:
        from chute._src.storage.records.writer import RecordWriter

        if isinstance(self._file, str):  # uploaded whole when the pass ends
            key = self._file.rsplit("/", 2)[-2]
            self._writer = RecordWriter(
                self._file, metadata=_metadata(key), storage_options=self._storage
            )
            self._written = 0
            return
        directory = self._file.parent
        directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            pass
        if not _is_own(directory, stat.S_IFDIR):
            warnings.warn(
                f"cache: {directory} is not a directory owned by this user and writable only "
                "by it, so this pass is not cached; delete it, or give .cache() a "
                "directory of your own",
                stacklevel=2,
            )
            return
        self._writer = RecordWriter(self._file, metadata=_metadata(directory.name))
        self._written = 0

    def _finish(self) -> None:
        if self._writer is not None and self._written == self._pos:
            self._writer.close()  # the file appears under its name only now
            self._writer = None
            if not isinstance(self._file, str):
                os.chmod(self._file, 0o600)  # whatever the umask: only its writer reads it
            self._open_cache()
        self._abort()

    def _abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()
            self._writer = None

    def get_state(self) -> dict[str, Any]:
        from_cache = int(
            self._source is not None and not self._may_write and self._pos != self._parent_at
        )
        return {
            "stage": self.stage,
            "position": self._pos,
            "from_cache": from_cache,
            "parent": (
                self._parent_state if self._parent_state is not None else self._parent.get_state()
            ),
        }

    def _restore(self, state: Any, path: str) -> None:
        check_state(state, self.stage, {"stage", "position", "from_cache", "parent"}, path)
        pos = check_int(state, "position", path)
        from_cache = check_int(state, "from_cache", path, 0, 1, "1 while reading the cache")
        if self._open_cache() and pos > self._len:
            raise bad_value(path, "position", pos, f"the cache holds {self._len} elements")
        self._abort()
        self._parent_at = self._parent_state = None
        if self._open_cache():
            # Served from the cache, the parent is not read. The pass's start in this run
            # (what a repeat rewinds to) is only reported; another state is restored into
            # the parent, which checks it.
            if state["parent"] == self._parent._catch_up(self._start):
                self._parent_state = state["parent"]
            else:
                self._parent._restore(state["parent"], f"{path}['parent']")
            self._may_write = False
            self._pos = pos
            self._parent_at = None if from_cache else pos
            return
        self._may_write = True
        if not from_cache:
            self._parent._restore(state["parent"], f"{path}['parent']")
            check_pass_position(self, state, self._start, pos, path)
            self._pos = pos
            return
        # Taken while reading a cache that is not here (deleted): recompute up to there.
        self._parent._restore(self._parent._catch_up(self._start), f"{path}['parent']")
        self._pos = 0
        for _ in range(pos):
            try:
                self.__next__()
            except StopIteration:
                raise bad_value(
                    path,
                    "position",
                    pos,
                    f"the stream has {self._pos} elements (found by computing it again)",
                ) from None

    def close(self) -> None:
        self._abort()
        super().close()
