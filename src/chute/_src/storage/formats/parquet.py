"""`ParquetDataSource`: rows of Parquet files as dicts (the `parquet` extra, pyarrow)."""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from chute._src.core.errors import DataError
from chute._src.storage.formats._concat import Concat
from chute._src.storage.formats._open import open_data
from chute._src.storage.formats._paths import PathsArg, expand_paths
from chute._src.storage.remote.file import RemoteFile
from chute._src.storage.remote.urls import StorageOptions

__all__ = ["ParquetDataSource"]


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("ParquetDataSource needs pyarrow: pip install 'chute[parquet]'") from e
    return pq


def _check_file_options(options: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """`options` for `pyarrow.parquet.ParquetFile`, each checked against its signature."""
    options = dict(options or {})
    known = inspect.signature(_pq().ParquetFile.__init__).parameters
    unknown = sorted(name for name in options if name not in known or name in ("self", "source"))
    if unknown:
        accepted = ", ".join(name for name in known if name not in ("self", "source"))
        raise TypeError(
            f"{where}: {unknown} are not options of pyarrow.parquet.ParquetFile, which reads "
            f"each file: give only its keyword options ({accepted})."
        )
    return options


class ParquetDataSource:
    """Rows of Parquet files as dicts `{column: value}`, by global index across files.

    Random access decodes the row group that holds a row and keeps decoded row groups (as
    Arrow tables) up to `cache_bytes`, most recently used first, so a file that fits is
    decoded once and random reads then cost a row's conversion to Python. A block of
    reads converts each row group's rows in one `take`. `columns` selects columns;
    `file_options` are keyword options of `pyarrow.parquet.ParquetFile` (`memory_map`,
    `buffer_size`, ...), given to it for every file.
    Page CRCs are checked where the writer stored them (pyarrow's
    `write_page_checksum=True`; off by default); a corrupt page or a value that does not
    convert raises `chute.DataError` naming the file and the row group or record.
    Picklable, thread-safe.
    """

    def __init__(
        self,
        paths: PathsArg,
        columns: Sequence[str] | None = None,
        *,
        cache_bytes: int = 256 << 20,
        storage_options: StorageOptions = None,
        file_options: Mapping[str, Any] | None = None,
    ) -> None:
        _pq()
        self._file_options = _check_file_options(file_options, "ParquetDataSource")
        self._storage = dict(storage_options or {})
        self._paths = expand_paths(paths, "ParquetDataSource", self._storage)
        self._columns = list(columns) if columns is not None else None
        self._cache_bytes = cache_bytes
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._files: list[Any] | None = None
        self._concat = Concat([])
        self._groups: list[Concat] = []
        self._cache: OrderedDict[tuple[int, int], Any] = OrderedDict()  # Arrow tables
        self._cached_bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        return {
            "paths": self._paths,
            "columns": self._columns,
            "cache": self._cache_bytes,
            "storage": self._storage,
            "file_options": self._file_options,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._paths, self._columns = state["paths"], state["columns"]
        self._storage = state["storage"]
        self._file_options = state["file_options"]
        self._cache_bytes = state["cache"]
        self._init_runtime()

    def _open(self) -> list[Any]:
        pq = _pq()
        with self._lock:
            if self._files is None:
                files = []
                for p in self._paths:
                    # Names a missing, directory or unreadable file.
                    guard = open_data(p, "a Parquet file", self._storage, lease=False)
                    # A remote file is read by ranges through chute's block cache.
                    source = guard.reader() if isinstance(guard, RemoteFile) else p
                    guard.close()
                    try:
                        f = pq.ParquetFile(
                            source, **{"page_checksum_verification": True, **self._file_options}
                        )
                    except Exception as e:  # pyarrow.ArrowInvalid and friends
                        raise DataError(
                            f"{p}: not a readable Parquet file ({e}); it is truncated, corrupt "
                            "or not Parquet; re-create it or restore a good copy"
                        ) from None
                    md = f.metadata
                    self._groups.append(
                        Concat([md.row_group(g).num_rows for g in range(md.num_row_groups)])
                    )
                    files.append(f)
                self._concat = Concat([len(g) for g in self._groups])
                self._files = files
            return self._files

    def __len__(self) -> int:
        self._files or self._open()
        return len(self._concat)

    def _row_group(self, k: int, g: int) -> Any:
        """Row group `g` of file `k` as an Arrow table, from the cache or decoded now."""
        key = (k, g)
        with self._lock:
            table = self._cache.get(key)
            if table is not None:
                self._cache.move_to_end(key)
                return table
            assert self._files is not None
            try:
                table = self._files[k].read_row_group(g, columns=self._columns)
            except Exception as e:  # pyarrow errors on corrupt pages
                raise DataError(
                    f"{self._paths[k]}: row group {g} could not be read ({e}); the file is "
                    "corrupt; re-create it or restore a good copy"
                ) from None
            self._cache[key] = table
            self._cached_bytes += table.nbytes
            while self._cached_bytes > self._cache_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= old.nbytes
            return table

    def _where(self, index: int) -> tuple[int, int, int]:
        k, i = self._concat.locate(index, self)
        g, j = self._groups[k].locate(i)
        return k, g, j

    def _convert_error(self, k: int, g: int, e: Exception, rows: list[int]) -> DataError:
        start = self._groups[k].starts[g]
        shown = f"record {start + rows[0]}" if len(rows) == 1 else f"records {start + rows[0]}.."
        return DataError(
            f"{self._paths[k]}: {shown} (row group {g}) could not be converted to Python "
            f"({type(e).__name__}: {e}); the file is corrupt; re-create it or restore a "
            "good copy"
        )

    def __getitem__(self, index: int) -> dict[str, Any]:
        self._files or self._open()
        k, g, j = self._where(index)
        table = self._row_group(k, g)
        try:
            row: dict[str, Any] = table.slice(j, 1).to_pylist()[0]
        except Exception as e:  # invalid UTF-8, bad offsets: pyarrow trusts the pages
            raise self._convert_error(k, g, e, [j]) from None
        return row

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        self._files or self._open()
        places = [self._where(i) for i in indices]
        by_group: dict[tuple[int, int], list[int]] = {}
        for n, (k, g, _) in enumerate(places):
            by_group.setdefault((k, g), []).append(n)
        out: list[Any] = [None] * len(places)
        for (k, g), positions in by_group.items():
            rows_in_group = [places[n][2] for n in positions]
            table = self._row_group(k, g)
            try:
                rows = table.take(rows_in_group).to_pylist()
            except Exception as e0:  # find the first bad row, in order, for the message
                for j in rows_in_group:
                    try:
                        table.slice(j, 1).to_pylist()
                    except Exception as e:
                        raise self._convert_error(k, g, e, [j]) from None
                raise self._convert_error(k, g, e0, rows_in_group) from None
            for n, row in zip(positions, rows):
                out[n] = row
        return out

    def __repr__(self) -> str:
        p = self._paths
        shown = repr(p[0]) if len(p) == 1 else f"<{len(p)} files: {p[0]!r}, ...>"
        cols = f", columns={self._columns!r}" if self._columns is not None else ""
        return f"ParquetDataSource({shown}{cols})"
