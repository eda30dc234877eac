"""Global record index -> (file number, index in file) over concatenated files, and the
lazily opened multi-file skeleton that the JSONL and TFRecord sources share."""

from __future__ import annotations

import abc
import bisect
import threading
from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

from chute._src.storage.formats._open import DataFile
from chute._src.storage.formats._paths import PathsArg, expand_paths, reads_in_flight_for
from chute._src.storage.remote.file import RemoteFile, open_concurrently, read_many
from chute._src.storage.remote.urls import StorageOptions

__all__ = ["Concat", "MultiFileSource"]


class OpenFile(Protocol):
    """What `MultiFileSource` needs of one opened file."""

    num_records: int
    guard: DataFile


F = TypeVar("F", bound=OpenFile)


class Concat:
    """Maps a global index to `(file, local index)` given each file's record count.

    >>> c = Concat([3, 0, 2])
    >>> len(c), c.locate(0), c.locate(3), c.locate(-1)
    (5, (0, 0), (2, 0), (2, 1))
    """

    def __init__(self, counts: Sequence[int]) -> None:
        self.starts: list[int] = []
        total = 0
        for n in counts:
            self.starts.append(total)
            total += n
        self.counts = list(counts)
        self.total = total

    def __len__(self) -> int:
        return self.total

    def locate(self, index: int, who: object = "source") -> tuple[int, int]:
        n = self.total
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} is out of range for {who} of length {n}")
        k = bisect.bisect_right(self.starts, index) - 1
        return k, index - self.starts[k]


class MultiFileSource(abc.ABC, Generic[F]):
    """Files opened on first use (and again after unpickling, in a worker), one global index.

    Subclasses name the options they keep in `_options` (pickled with the paths), open one
    file in `_open_file` (an `OpenFile`: `num_records`, `guard`) and read record `i` of an
    opened file in `_record`, the bytes it reads given by `_span`. Every read first makes
    sure the file has not shrunk since it was opened (`FileGuard`: a flag test while
    leased), once per block in `__getitems__`.
    """

    _options: tuple[str, ...] = ()

    def __init__(
        self, paths: PathsArg, *, storage_options: StorageOptions = None, **options: Any
    ) -> None:
        self._storage = dict(storage_options or {})
        self._paths = expand_paths(paths, type(self).__name__, self._storage)
        for name in self._options:
            setattr(self, f"_{name}", options[name])
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._files: list[F] | None = None
        self._concat = Concat([])
        self._remote = False

    @abc.abstractmethod
    def _open_file(self, path: str) -> F:
        """Opens (and indexes) one file."""

    @abc.abstractmethod
    def _record(self, f: F, i: int) -> Any:
        """Record `i` of the opened file `f`, its size already checked."""

    @abc.abstractmethod
    def _span(self, f: F, i: int) -> tuple[int, int]:
        """The bytes `_record(f, i)` reads (fetched ahead, all at once, for remote files)."""

    def __getitem__(self, index: int) -> Any:
        f, i = self._locate(index)
        f.guard.check(i)  # a file that shrank raises here rather than faulting (SIGBUS)
        return self._record(f, i)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        if self._remote:
            return self._getitems_remote(indices)
        checked: set[int] = set()
        out = []
        for g in indices:
            f, i = self._locate(g)
            f.guard.check_once(checked, i)
            out.append(self._record(f, i))
        return out

    def _getitems_remote(self, indices: Sequence[int]) -> list[Any]:
        """Fetches every record's bytes in one round of concurrent range reads (into the
        block cache), then reads the records as usual."""
        located = [self._locate(g) for g in indices]
        read_many(
            [(f.guard, *self._span(f, i)) for f, i in located if isinstance(f.guard, RemoteFile)]
        )
        return [self._record(f, i) for f, i in located]

    @property
    def reads_in_flight(self) -> int:
        """Reads a pipeline should keep in flight from the start (`_src/core/in_flight.py`):
        many for remote files (each read waits a round trip), none for local ones."""
        return reads_in_flight_for(self._paths)

    def __getstate__(self) -> dict[str, Any]:
        options = {n: getattr(self, f"_{n}") for n in self._options}
        return {"paths": self._paths, "storage": self._storage, **options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._paths = state["paths"]
        self._storage = state["storage"]
        for name in self._options:
            setattr(self, f"_{name}", state[name])
        self._init_runtime()

    def _open(self) -> list[F]:
        with self._lock:
            if self._files is None:
                files = open_concurrently(lambda k: self._open_file(self._paths[k]), self._paths)
                self._concat = Concat([f.num_records for f in files])
                self._remote = any(isinstance(f.guard, RemoteFile) for f in files)
                self._files = files
            return self._files

    def __len__(self) -> int:
        self._files or self._open()
        return len(self._concat)

    def _locate(self, index: int) -> tuple[F, int]:
        """The file holding global record `index`, and the record's index in it."""
        files = self._files or self._open()
        k, i = self._concat.locate(index, self)
        return files[k], i

    def record_location(self, index: int) -> dict[str, Any]:
        """Where record `index` is stored: its file, the file's number (shard) and the
        record's number in it (what `chute.experimental.provenance` shows)."""
        self._files or self._open()
        k, i = self._concat.locate(index, self)
        return {"file": self._paths[k], "shard": k, "record": i}

    def _shown_paths(self) -> str:
        p = self._paths
        return repr(p[0]) if len(p) == 1 else f"<{len(p)} files: {p[0]!r}, ...>"
