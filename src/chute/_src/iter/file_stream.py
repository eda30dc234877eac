"""Resumable streams over plain files: lines, and JSON Lines, across many files.

For files too large (or too many) to index for random access: the files are read in
order, line by line, and the state is where the next line starts, `(file, offset)`, so
restoring seeks there instead of reading from the start. Files are opened lazily, one at
a time, so creating many of these (one per file for `InterleaveIterDataset`) is cheap.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from chute._src.dataset import IterDataset
from chute._src.errors import CheckpointError, DataError
from chute._src.iterator import DatasetIterator, bad_value, check_int
from chute._src.protocol import StageRole
from chute._src.remote.urls import StorageOptions
from chute._src.sources._open import open_binary
from chute._src.sources._paths import expand_paths
from chute._src.transforms import describe

_READ_HINT = 1 << 16  # bytes of lines read per call


class FileLinesIterDataset(IterDataset[Any]):
    """The lines of `paths` (a path, a glob, or a list of them), in order, as `parse(line)`.

    `line` is the bytes of the line without its line ending; `parse` defaults to decoding
    UTF-8. Empty lines are skipped.

    >>> import os, tempfile, chute
    >>> d = tempfile.mkdtemp()
    >>> for name, text in [("a.txt", "x\\ny\\n"), ("b.txt", "z\\n")]:
    ...     _ = open(os.path.join(d, name), "w").write(text)
    >>> ds = chute.experimental.FileLinesIterDataset(os.path.join(d, "*.txt"))
    >>> it = iter(ds)
    >>> next(it), it.get_state()
    ('x', {'stage': 'file_lines', 'file': 0, 'offset': 2, 'files': 2})
    >>> list(it)
    ['y', 'z']
    """

    _where = "FileLinesIterDataset"
    role = StageRole.SOURCE

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        parse: Callable[[bytes], Any] | None = None,
        *,
        storage_options: StorageOptions = None,
    ) -> None:
        super().__init__()
        self._storage = dict(storage_options or {})
        self._paths = expand_paths(paths, self._where, self._storage)
        if parse is not None and not callable(parse):
            raise TypeError(f"{self._where}: parse={parse!r} is not callable: pass a function.")
        self._parse: Callable[[bytes], Any] = parse or _utf8

    @property
    def paths(self) -> list[str]:
        return list(self._paths)

    def make_iterator(self) -> DatasetIterator[Any]:
        return _LinesIterator(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(paths={self._paths!r}, parse={describe(self._parse)})"

    def _fingerprint_params(self) -> str:
        return ""  # the number of files is in the iterator's own state


def _utf8(line: bytes) -> str:
    return line.decode("utf-8")


class JsonlIterDataset(FileLinesIterDataset):
    """The JSON objects of JSON Lines files `paths`, in order; resumable at any line.

    >>> import os, tempfile, chute
    >>> path = os.path.join(tempfile.mkdtemp(), "data.jsonl")
    >>> _ = open(path, "w").write('{"a": 1}\\n{"a": 2}\\n')
    >>> list(chute.experimental.JsonlIterDataset(path))
    [{'a': 1}, {'a': 2}]
    """

    _where = "JsonlIterDataset"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        parse: Callable[[bytes], Any] | None = None,
        *,
        storage_options: StorageOptions = None,
    ) -> None:
        super().__init__(paths, parse or json.loads, storage_options=storage_options)


class _LinesIterator(DatasetIterator[Any]):
    stage = "file_lines"

    def __init__(self, ds: FileLinesIterDataset) -> None:
        super().__init__()
        self._ds = ds
        self._paths = ds._paths
        self._parse = ds._parse
        self._file = 0
        self._offset = 0  # where the next line of file `_file` starts
        self._fh: io.BufferedReader | None = None
        self._lines: list[bytes] = []  # read ahead, not yet handed out
        self._pos = 0

    def _open(self, name: str) -> io.BufferedReader:
        return open_binary(name, "a text file", self._ds._storage)

    def _fill(self) -> bool:
        """Reads more lines; False at the end of the last file."""
        while self._file < len(self._paths):
            if self._fh is None:
                self._fh = self._open(self._paths[self._file])
                self._fh.seek(self._offset)
            lines = self._fh.readlines(_READ_HINT)
            if lines:
                self._lines, self._pos = lines, 0
                return True
            self._fh.close()
            self._fh = None
            self._file += 1
            self._offset = 0
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
                f"{self._ds._where}: line at byte {at} of {self._paths[self._file]} cannot be "
                f"parsed ({type(e).__name__}: {e}): fix or drop that line, or pass parse= "
                "that accepts it."
            ) from e

    def own_state(self) -> dict[str, Any]:
        return {"file": self._file, "offset": self._offset, "files": len(self._paths)}

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        files = check_int(state, "files", path)
        if files != len(self._paths):
            raise CheckpointError(
                f"{path}['files'] = {files}, but this stream reads {len(self._paths)} files: "
                "the state is from a stream over other files; restore it into the stream "
                "it was taken from."
            )
        file = check_int(
            state,
            "file",
            path,
            0,
            len(self._paths),
            f"the index of one of the {len(self._paths)} files, or the end",
        )
        offset = check_int(state, "offset", path)
        if file == len(self._paths) and offset:
            raise bad_value(path, "offset", offset, "past the last file, the offset is 0")
        if file < len(self._paths):
            name = self._paths[file]
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
        self._file, self._offset = file, offset
        self._lines, self._pos = [], 0

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
