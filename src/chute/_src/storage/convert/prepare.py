"""The records a conversion writes: an input's records, optionally preprocessed.

One description (`RecordJob`: inputs, format, transformations, seed) serves the
single-process `chute convert` and the Beam job alike, so both write the same records.
Without transformations the records are the input's, as `chute convert` stores them.
With them, record `i` is element `i` of

    chute.MapDataset.source(source).seed(seed).apply(transforms)

where `source` is the format's chute source with its defaults (`JsonlDataSource(paths)`
decodes each line), exactly what the online pipeline gives for that element; a position
a `Filter` rejects writes nothing. The last transformation must return bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from chute._src.core.transforms import (
    FilterTransform,
    MapTransform,
    MapWithIndex,
    RandomMapTransform,
)
from chute._src.storage.convert.inputs import Format, as_bytes_source, open_source
from chute._src.storage.records.checksum import crc32c
from chute._src.storage.remote.urls import StorageOptions, is_url

__all__ = ["OpenedJob", "RecordJob", "check_transforms"]

_ELEMENT_WISE = (MapTransform, RandomMapTransform, FilterTransform, MapWithIndex)
_BLOCK = 1024


def check_transforms(transforms: Sequence[Any]) -> tuple[Any, ...]:
    """`transforms` as a tuple, each checked to be element-wise (or a plain function,
    applied as a map); anything else raises TypeError naming the rule and the fix."""
    out = tuple(transforms)
    for position, t in enumerate(out):
        if isinstance(t, _ELEMENT_WISE):
            continue
        if callable(t) and not isinstance(t, type):
            continue
        raise TypeError(
            f"transformation {position}, {t!r} of type {type(t).__name__}, cannot run at "
            "conversion time: a conversion writes one record per input record, so only "
            "element-wise transformations apply (chute.transforms.Map, RandomMap, Filter, "
            "MapWithIndex, or a plain function, applied as a map); batch or pack in the "
            "online pipeline instead"
        )
    return out


def _name(t: Any) -> str:
    kind = t if callable(t) and not isinstance(t, _ELEMENT_WISE) else type(t)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"


def _pair(index: int, element: Any) -> tuple[int, Any]:
    return index, element


@dataclass(frozen=True)
class RecordJob:
    """What a conversion reads and how it prepares each record (picklable, small)."""

    paths: tuple[str, ...]
    fmt: Format
    transforms: tuple[Any, ...] = ()
    seed: int | None = None
    options: tuple[Any, ...] = field(default=())  # what else fixes the output bytes
    storage_options: StorageOptions = field(default=None, compare=False)  # URL inputs

    @property
    def filters(self) -> bool:
        """Whether some positions may write nothing (a Filter is among the transforms)."""
        return any(isinstance(t, FilterTransform) for t in self.transforms)

    def fingerprint(self) -> str:
        """A CRC32C of everything that decides the records: input paths, sizes and
        modification times, the format, transformation kinds, seed and options."""
        files = [
            [p] if is_url(p) else [os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns]
            for p in self.paths
        ]
        key = [files, self.fmt.value, [_name(t) for t in self.transforms], self.seed]
        key.append(list(self.options))
        return f"{crc32c(json.dumps(key).encode()):08x}"

    def open(self) -> OpenedJob:
        return OpenedJob(self)


class OpenedJob:
    """A `RecordJob` with its source open: `len`, the metadata to store, and records."""

    def __init__(self, job: RecordJob) -> None:
        self.job = job
        if not job.transforms:
            self._source, self.metadata = as_bytes_source(
                open_source(job.paths, job.fmt, job.storage_options), job.fmt
            )
            self._pairs: Any = None
            self._len = len(self._source)
            return
        from chute._src.core.dataset import MapDataset

        raw = open_source(job.paths, job.fmt, job.storage_options, decoded=True)
        ds: Any = MapDataset.source(raw)
        if job.seed is not None:
            ds = ds.seed(job.seed)
        for t in job.transforms:
            ds = ds.apply([t]) if isinstance(t, _ELEMENT_WISE) else ds.map(t)
        self._pairs = ds.map_with_index(_pair)
        self._len = len(ds)
        self.metadata = {
            "source_format": job.fmt.value,
            "transforms": [_name(t) for t in job.transforms],
        }

    def __len__(self) -> int:
        return self._len

    def blocks(self, lo: int, hi: int) -> Iterator[tuple[int, list[bytes]]]:
        """Positions `[lo, hi)` a block at a time: (positions covered, their records),
        filtered positions left out."""
        if self._pairs is None:
            getitems = self._source.__getitems__
            for start in range(lo, hi, _BLOCK):
                end = min(start + _BLOCK, hi)
                yield end - start, getitems(list(range(start, end)))
            return
        for start in range(lo, hi, _BLOCK):
            end = min(start + _BLOCK, hi)
            yield end - start, [r for _, r in self._checked(start, end)]

    def records(self, lo: int, hi: int) -> Iterator[tuple[int, bytes]]:
        """(position, record) for the positions in [lo, hi) that write one, in order."""
        if self._pairs is None:
            for start, (count, block) in zip(range(lo, hi, _BLOCK), self.blocks(lo, hi)):
                yield from zip(range(start, start + count), block)
            return
        yield from self._checked(lo, hi)

    def _checked(self, lo: int, hi: int) -> Iterator[tuple[int, bytes]]:
        for i, record in self._pairs[lo:hi]:
            if not isinstance(record, bytes | bytearray | memoryview):
                raise TypeError(
                    f"element {i}: the transformations returned {type(record).__name__}, "
                    "not bytes; a record is bytes: end them with a Map that encodes the "
                    "element (json.dumps(x).encode(), np.asarray(x).tobytes(), ...)"
                )
            yield i, bytes(record)
