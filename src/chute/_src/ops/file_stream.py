"""Resumable streams over plain files: lines, and JSON Lines, across many files.

For files too large (or too many) to index for random access. Each file is one shard:
its lines are read in order, and its state is where the next line starts (a byte offset),
so restoring seeks there instead of reading from the start. The files are merged by the
interleave rule (`InterleaveIterDataset`): `cycle_length` files at a time, one line from
each in turn; with the default `cycle_length=1`, one file after the other. So the stream
splits by file across `mp_prefetch`'s workers with the same output for any number of
them. Files are opened lazily, so a stream over many files is cheap to create.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset
from chute._src.core.errors import CheckpointError, DataError
from chute._src.core.iterator import DatasetIterator, check_int
from chute._src.core.transforms import describe
from chute._src.core.tuning import AUTOTUNE, Autotune
from chute._src.ops.interleave import InterleaveIterDataset
from chute._src.storage.formats._open import open_binary
from chute._src.storage.formats._paths import expand_paths
from chute._src.storage.remote.urls import StorageOptions

_READ_HINT = 1 << 16  # bytes of lines read per call
_LINES_PER_READ = 64  # lines a reader thread (or worker) reads per request

PathsArg = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class FileLinesIterDataset(InterleaveIterDataset):
    """The lines of `paths` (a path, a glob, or a list of them), as `parse(line)`.

    `line` is the bytes of the line without its line ending; `parse` defaults to decoding
    UTF-8. Empty lines are skipped. The files are read `cycle_length` at a time, one line
    from each in turn (the interleave rule of `InterleaveIterDataset`; the default 1 reads
    them one after the other), ahead on `parallelism` threads.

    >>> import os, tempfile, chute
    >>> d = tempfile.mkdtemp()
    >>> for name, text in [("a.txt", "x\\ny\\n"), ("b.txt", "z\\n")]:
    ...     _ = open(os.path.join(d, name), "w").write(text)
    >>> ds = chute.experimental.FileLinesIterDataset(os.path.join(d, "*.txt"))
    >>> list(ds)
    ['x', 'y', 'z']
    >>> list(chute.experimental.FileLinesIterDataset(os.path.join(d, "*.txt"), cycle_length=2))
    ['x', 'z', 'y']
    """

    _where = "FileLinesIterDataset"

    def __init__(
        self,
        paths: PathsArg,
        parse: Callable[[bytes], Any] | None = None,
        *,
        cycle_length: int = 1,
        parallelism: int | Autotune | None = AUTOTUNE,
        storage_options: StorageOptions = None,
    ) -> None:
        storage = dict(storage_options or {})
        files = expand_paths(paths, self._where, storage)
        if parse is not None and not callable(parse):
            raise TypeError(f"{self._where}: parse={parse!r} is not callable: pass a function.")
        fn: Callable[[bytes], Any] = parse or _utf8
        super().__init__(
            [_FileLines(path, fn, self._where, storage) for path in files],
            cycle_length=cycle_length,
            # A whole next cycle of files opened while this one is read: shards of one
            # size end together, and opening one from a bucket costs a round trip.
            make_iter_buffer_size=cycle_length,
            iter_buffer_size=_LINES_PER_READ,
            parallelism=parallelism,
        )
        self._paths = files
        self._parse = fn

    @property
    def paths(self) -> list[str]:
        return list(self._paths)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(paths={self._paths!r}, parse={describe(self._parse)}, "
            f"cycle_length={self._cycle})"
        )


def _utf8(line: bytes) -> str:
    return line.decode("utf-8")


class JsonlIterDataset(FileLinesIterDataset):
    """The JSON objects of JSON Lines files `paths`; resumable at any line.

    >>> import os, tempfile, chute
    >>> path = os.path.join(tempfile.mkdtemp(), "data.jsonl")
    >>> _ = open(path, "w").write('{"a": 1}\\n{"a": 2}\\n')
    >>> list(chute.experimental.JsonlIterDataset(path))
    [{'a': 1}, {'a': 2}]
    """

    _where = "JsonlIterDataset"

    def __init__(
        self,
        paths: PathsArg,
        parse: Callable[[bytes], Any] | None = None,
        *,
        cycle_length: int = 1,
        parallelism: int | Autotune | None = AUTOTUNE,
        storage_options: StorageOptions = None,
    ) -> None:
        super().__init__(
            paths,
            parse or json.loads,
            cycle_length=cycle_length,
            parallelism=parallelism,
            storage_options=storage_options,
        )


class _FileLines(IterDataset[Any]):
    """One shard of a `FileLinesIterDataset`: the lines of one file."""

    _role = StageRole.SOURCE

    def __init__(
        self, path: str, parse: Callable[[bytes], Any], where: str, storage: dict[str, Any]
    ) -> None:
        super().__init__()
        self._path = path
        self._storage = storage
        self._parse = parse
        self._where = where

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _LinesIterator(self)

    def __repr__(self) -> str:
        return f"{self._where} shard {self._path!r}"


class _LinesIterator(DatasetIterator[Any]):
    stage = "file_lines"

    def __init__(self, ds: _FileLines) -> None:
        super().__init__()
        self._ds = ds
        self._path = ds._path
        self._parse = ds._parse
        self._offset = 0  # where the next line starts
        self._fh: io.BufferedReader | None = None
        self._done = False
        self._lines: list[bytes] = []  # read ahead, not yet handed out
        self._pos = 0

    def _open(self, name: str) -> io.BufferedReader:
        return open_binary(name, "a text file", self._ds._storage)

    def _fill(self) -> bool:
        """Reads more lines; False at the end of the file."""
        if self._done:
            return False
        if self._fh is None:
            self._fh = self._open(self._path)
            self._fh.seek(self._offset)
        lines = self._fh.readlines(_READ_HINT)
        if lines:
            self._lines, self._pos = lines, 0
            return True
        self.close()
        self._done = True
        return False

    def _next_line(self) -> tuple[bytes, int] | None:
        while True:
            if self._pos >= len(self._lines) and not self._fill():
                return None
            raw = self._lines[self._pos]
            self._pos += 1
            at = self._offset
            self._offset += len(raw)
            line = raw.rstrip(b"\r\n")
            if line:
                return line, at

    def __next__(self) -> Any:
        got = self._next_line()
        if got is None:
            raise StopIteration
        line, at = got
        try:
            return self._parse(line)
        except Exception as e:
            raise DataError(
                f"{self._ds._where}: line at byte {at} of {self._path} cannot be "
                f"parsed ({type(e).__name__}: {e}): fix or drop that line, or pass parse= "
                "that accepts it."
            ) from e

    def own_state(self) -> dict[str, Any]:
        return {"offset": self._offset}

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        offset = check_int(state, "offset", path)
        name = self._path
        with self._open(name) as fh:
            size = fh.seek(0, io.SEEK_END)
            fh.seek(max(0, offset - 1))
            before = fh.read(1)
        if offset > size:
            raise CheckpointError(
                f"{path}['offset'] = {offset} is past the end of {name} ({size} bytes): "
                "the file changed since the state was taken, or the state is from other "
                "files; restore it into the stream it was taken from."
            )
        if 0 < offset < size and before != b"\n":
            raise CheckpointError(
                f"{path}['offset'] = {offset} is not the start of a line of {name} (the "
                "byte before it is not a newline): the file changed since the state was "
                "taken, or the state is corrupt; restore a state taken from this stream."
            )
        self.close()
        self._offset, self._done = offset, False
        self._lines, self._pos = [], 0

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
