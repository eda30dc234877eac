"""`verify`: check every checksum of a `.crec` dataset."""

from __future__ import annotations

from collections.abc import Callable

from chute._src.storage.formats._paths import PathsArg
from chute._src.storage.formats.crec import RecordFileDataSource
from chute._src.storage.remote.file import read_many
from chute._src.storage.remote.urls import StorageOptions

__all__ = ["verify"]


def verify(
    paths: PathsArg,
    progress: Callable[[int, int], None] | None = None,
    storage_options: StorageOptions = None,
) -> int:
    """Checks every record's CRC32C (and that compressed records decompress).

    Returns the number of records checked; raises `chute.DataError` at the first bad
    record, naming its file and index. `progress(records, bytes)` is called as it goes.

    >>> import tempfile, os
    >>> from chute.records import RecordWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "v.crec")
    >>> with RecordWriter(path) as w:
    ...     _ = w.write(b"x" * 10)
    >>> verify(path)
    1
    """
    src = RecordFileDataSource(paths, verify_checksums=True, storage_options=storage_options)
    total = 0
    for f in src._open():
        lengths = f.lengths
        step = 0
        nbytes = 0
        for i in range(f.num_records):
            if f.remote and i % 4096 == 0:  # 4096 payloads per round of range reads
                got = read_many(
                    [
                        (f.mm, f.offsets[j], f.offsets[j] + lengths[j])
                        for j in range(i, min(i + 4096, f.num_records))
                    ]
                )
            if f.remote:
                f.decode(i, got[i % 4096])
            else:
                f.check(i)
            nbytes += lengths[i]
            step += 1
            if progress is not None and step == 4096:
                progress(step, nbytes)
                step = nbytes = 0
        if progress is not None and step:
            progress(step, nbytes)
        total += f.num_records
    src.close()
    return total
