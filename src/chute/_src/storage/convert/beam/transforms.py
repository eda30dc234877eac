"""Beam PTransforms: read records from any format chute reads, write `.crec` or
ArrayRecord shards deterministically, and the two together (`ConvertRecords`)."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

try:
    import apache_beam as beam
    from apache_beam.typehints import typehints
except ImportError as e:  # pragma: no cover - the [beam] extra is in the test extra
    raise ImportError("chute.beam needs Apache Beam: pip install 'chute[beam]'") from e

from chute._src.storage.convert.beam.shards import (
    ShardSpec,
    content_key,
    finish,
    prepare_output,
    write_shard,
)
from chute._src.storage.convert.inputs import Format, detect_format, open_source
from chute._src.storage.convert.prepare import RecordJob, check_transforms
from chute._src.storage.formats._paths import PathsArg, expand_paths
from chute._src.storage.records.manifest import ShardEntry
from chute._src.storage.remote.urls import StorageOptions

__all__ = ["ConvertRecords", "ReadRecords", "WriteShards"]

_RANGE = 4096


def record_job(
    paths: PathsArg,
    fmt: Format | str | None,
    transforms: Sequence[Any],
    seed: int | None,
    options: Sequence[Any] = (),
    storage_options: StorageOptions = None,
) -> RecordJob:
    """The job reading `paths` (expanded, format detected or given)."""
    files = expand_paths(paths, "chute.beam", storage_options)
    if fmt is None:
        found = {detect_format(p) for p in files}
        if len(found) > 1:
            names = ", ".join(sorted(f.value for f in found))
            raise ValueError(f"the inputs mix formats ({names}); read them separately")
        fmt = found.pop()
    checked = check_transforms(transforms)
    return RecordJob(
        tuple(files), Format(fmt), checked, seed, tuple(options), storage_options=storage_options
    )


def split_ranges(
    job: RecordJob, cuts: Iterable[int], records_per_range: int
) -> tuple[int, list[tuple[int, int]]]:
    """The number of positions and `[lo, hi)` ranges covering them: cut at every file
    boundary, at `cuts`, and at most `records_per_range` long."""
    if records_per_range < 1:
        raise ValueError(f"records_per_range={records_per_range} is invalid; give 1 or more")
    bounds = {0}
    n = 0
    for p in job.paths:
        n += len(open_source([p], job.fmt, job.storage_options))
        bounds.add(n)
    bounds.update(c for c in cuts if 0 <= c <= n)
    edges = sorted(bounds)
    ranges: list[tuple[int, int]] = []
    for lo, hi in itertools.pairwise(edges):
        pieces = max(1, math.ceil((hi - lo) / records_per_range))
        ranges.extend(
            (lo + j * (hi - lo) // pieces, lo + (j + 1) * (hi - lo) // pieces)
            for j in range(pieces)
        )
    return n, [r for r in ranges if r[1] > r[0]]


class _ReadRange(beam.DoFn):
    """(lo, hi) -> the (position, record) pairs of those positions; the source is opened
    once per worker."""

    def __init__(self, job: RecordJob) -> None:
        self._job = job
        self._opened: Any = None

    def setup(self) -> None:
        self._opened = self._job.open()

    def process(self, element: tuple[int, int]) -> Iterator[tuple[int, bytes]]:
        lo, hi = element
        yield from self._opened.records(lo, hi)


def _read(pbegin: Any, job: RecordJob, ranges: list[tuple[int, int]]) -> Any:
    # Create spreads its elements over the workers (it reshuffles them) by itself.
    return pbegin | "Ranges" >> beam.Create(ranges) | "Records" >> beam.ParDo(_ReadRange(job))


class _ReadBlock(beam.DoFn):
    """(lo, hi), inside one shard -> (shard, (lo, the records of [lo, hi))): one element
    per range, so the shuffle moves a few large elements rather than one per record."""

    def __init__(self, job: RecordJob, spec: ShardSpec) -> None:
        self._job = job
        self._spec = spec
        self._opened: Any = None

    def setup(self) -> None:
        self._opened = self._job.open()
        self._starts = self._spec.starts()

    def process(self, element: tuple[int, int]) -> Iterator[tuple[int, tuple[int, list[bytes]]]]:
        lo, hi = element
        block = [r for _, r in self._opened.records(lo, hi)]
        yield self._spec.shard_of(lo, self._starts), (lo, block)


class _WriteBlocks(beam.DoFn):
    def __init__(self, spec: ShardSpec) -> None:
        self._spec = spec

    def process(self, element: tuple[int, Iterable[tuple[int, list[bytes]]]]) -> Iterator[Any]:
        k, blocks = element
        ordered = sorted(blocks, key=lambda b: b[0])
        yield k, write_shard(self._spec, k, (r for _, block in ordered for r in block))


class ReadRecords(beam.PTransform):
    """Reads the records of `paths` as a PCollection of `(position, record)`.

    `position` is the record's index in the inputs' global order (files in the order
    given, globs sorted). Every format chute reads works (TFRecord, JSONL, Parquet,
    ArrayRecord, `.crec`, NumPy), through chute's own sources; the work is split by file
    and into ranges of at most `records_per_range` records, spread over the workers.
    Without `transforms` a record is what `chute convert` stores (bytes). With them,
    record `i` is element `i` of `MapDataset.source(source).seed(seed).apply(transforms)`
    (`source` as the format's chute source gives elements by default) and positions a
    `Filter` rejects are left out: the online pipeline's elements, computed once. The
    last transformation must return bytes. `num_positions` (the number of input
    records) is known once the transform is built. URL inputs are read with
    `storage_options`, which travel with the transform to every worker.
    """

    def __init__(
        self,
        paths: PathsArg,
        *,
        format: Format | str | None = None,
        transforms: Sequence[Any] = (),
        seed: int | None = None,
        records_per_range: int = _RANGE,
        storage_options: StorageOptions = None,
    ) -> None:
        super().__init__()
        self.job = record_job(paths, format, transforms, seed, (), storage_options)
        self.job.open()  # fails here, not in a worker, for a bad input or pipeline
        self.num_positions, self._ranges = split_ranges(self.job, (), records_per_range)

    def expand(self, pbegin: Any) -> Any:
        return _read(pbegin, self.job, self._ranges)


class _WriteShard(beam.DoFn):
    def __init__(self, spec: ShardSpec) -> None:
        self._spec = spec

    def process(self, element: tuple[int, Iterable[tuple[Any, bytes]]]) -> Iterator[Any]:
        k, keyed = element
        # By position, or for records without one by (digest, bytes): a total order.
        records = sorted(keyed)
        yield k, write_shard(self._spec, k, (r for _, r in records))


def _positioned_key(spec: ShardSpec) -> Any:
    starts = spec.starts()

    def key(pair: tuple[int, bytes]) -> tuple[int, tuple[int, bytes]]:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], int)):
            raise TypeError(
                f"WriteShards(num_positions=...) takes (position, record) pairs, got "
                f"{type(pair).__name__} {_short(pair)}; for a PCollection of records leave "
                "num_positions out"
            )
        return spec.shard_of(pair[0], starts), pair

    return key


def _content_key(spec: ShardSpec) -> Any:
    def key(record: bytes) -> tuple[int, tuple[bytes, bytes]]:
        if not isinstance(record, bytes):
            hint = (
                "for (position, record) pairs give num_positions= (ReadRecords tells it)"
                if isinstance(record, tuple)
                else "encode each element to bytes first (a beam.Map before WriteShards)"
            )
            raise TypeError(
                f"WriteShards takes records as bytes, got {type(record).__name__} "
                f"{_short(record)}; {hint}"
            )
        k, digest = content_key(record, spec.num_shards)
        return k, (digest, record)

    return key


def _check_element_type(pcoll: Any, spec: ShardSpec) -> None:
    """Refuses, when the pipeline is built, a PCollection whose declared or inferred
    element type cannot be what `WriteShards` takes, with the fix; elements of a type
    Beam does not know (`Any`) are checked one by one as they are written."""
    declared = getattr(pcoll, "element_type", None)
    if declared is None:
        return
    if spec.positioned:
        expected: Any = typehints.Tuple[int, bytes]
        if typehints.is_consistent_with(declared, expected):
            return
        raise TypeError(
            f"WriteShards(num_positions=...) takes (position, record) pairs, got a "
            f"PCollection of {_type_name(declared)}; for a PCollection of records leave "
            "num_positions out"
        )
    if typehints.is_consistent_with(declared, bytes):
        return
    hint = (
        "for (position, record) pairs give num_positions= (ReadRecords tells it)"
        if isinstance(declared, typehints.TupleConstraint) or declared is tuple
        else "encode each element to bytes first (a beam.Map before WriteShards)"
    )
    raise TypeError(
        f"WriteShards takes records as bytes, got a PCollection of {_type_name(declared)}; {hint}"
    )


def _type_name(hint: Any) -> str:
    """`Tuple[int, bytes]` for Beam's `Tuple[<class 'int'>, <class 'bytes'>]`."""
    return re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", str(hint))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _finish(spec: ShardSpec) -> Any:
    def run(written: list[tuple[int, ShardEntry]]) -> str:
        return finish(spec, written)

    return run


def _commit(written: Any, spec: ShardSpec) -> Any:
    return written | "AllShards" >> beam.combiners.ToList() | "Manifest" >> beam.Map(_finish(spec))


def _write(pcoll: Any, spec: ShardSpec) -> Any:
    written = (
        pcoll
        | "KeyByShard" >> beam.Map(_positioned_key(spec) if spec.positioned else _content_key(spec))
        | "GroupByShard" >> beam.GroupByKey()
        | "WriteShard" >> beam.ParDo(_WriteShard(spec))
    )
    return _commit(written, spec)


class WriteShards(beam.PTransform):
    """Writes a PCollection of records (bytes) as `num_shards` shards and a manifest.

    As `WriteToArrayRecord` or `WriteToText` take it: a PCollection of unknown size, in
    no order. A record's shard and its place there are fixed by its bytes (an 8-byte
    BLAKE2b digest picks the shard, records are sorted by digest within it), so the same
    records give the same files byte for byte whatever the runner's parallelism and the
    order it delivers them in; shards are balanced by the hash, not exactly.

    With `num_positions` the input is instead `(position, record)` pairs (`ReadRecords`
    gives them, and tells `num_positions`): shard `k` holds the records whose positions
    lie in `[k*n//S, (k+1)*n//S)` (`n` = `num_positions`), sorted by position, so the
    shards hold the input's order. Files are named `part-00003-of-00016.crec`
    (or `.array_record` with `format="arrayrecord"`), each written atomically; the
    manifest (counts, sizes, checksums) is written once every shard is committed, and
    the output is a PCollection holding its path. The output directory is checked and
    claimed when the pipeline is built: a new or empty directory, or one a failed run of
    the same job (`job_id`) left, whose complete shards are kept, not rewritten. Each
    shard is gathered in one worker's memory: choose `num_shards` so a shard fits.
    `output` may be a URL (`s3://bucket/prefix`): each file is staged locally and uploaded
    whole, the manifest last; `storage_options` (fsspec's: credentials, endpoint) travel
    with the transform to every worker.
    """

    def __init__(
        self,
        output: str,
        *,
        num_shards: int,
        num_positions: int | None = None,
        format: str = "crec",
        compression: str = "none",
        level: int = 3,
        job_id: str = "",
        metadata: dict[str, Any] | None = None,
        exact_counts: bool = True,
        storage_options: StorageOptions = None,
    ) -> None:
        super().__init__()
        key = json.dumps([output, num_shards, num_positions, format, compression, level])
        from chute._src.storage.records.checksum import crc32c

        self.spec = ShardSpec(
            output=str(output),
            num_shards=num_shards,
            num_positions=num_positions,
            job_id=job_id or f"{crc32c(key.encode()):08x}",
            shard_format=Format(format).value,
            metadata_json=json.dumps(metadata or {}, sort_keys=True),
            exact_counts=exact_counts and num_positions is not None,
            compression=compression,
            level=level,
            storage_options=storage_options,
        )
        self.complete = prepare_output(self.spec)

    def expand(self, pcoll: Any) -> Any:
        _check_element_type(pcoll, self.spec)
        return _write(pcoll, self.spec)


class ConvertRecords(beam.PTransform):
    """`ReadRecords` then `WriteShards`: converts `paths` into a sharded dataset at
    `output`, the records optionally preprocessed by `transforms` (see `ReadRecords`).

    A rerun after a failure reads only the positions of the shards not yet complete.
    `completed_before` names the shards an earlier attempt had committed. `paths` and
    `output` may be URLs, reached with `storage_options` (see `WriteShards`).
    """

    def __init__(
        self,
        paths: PathsArg,
        output: str,
        *,
        num_shards: int,
        format: Format | str | None = None,
        to_format: str = "crec",
        compression: str = "none",
        level: int = 3,
        transforms: Sequence[Any] = (),
        seed: int | None = None,
        records_per_range: int = _RANGE,
        storage_options: StorageOptions = None,
    ) -> None:
        super().__init__()
        to = Format(to_format).value
        options = (num_shards, to, compression, level)
        self.job = record_job(paths, format, transforms, seed, options, storage_options)
        opened = self.job.open()
        n = len(opened)
        spec = ShardSpec(
            output=str(output),
            num_shards=num_shards,
            num_positions=n,
            job_id=self.job.fingerprint(),
            shard_format=to,
            metadata_json=json.dumps(opened.metadata, sort_keys=True),
            exact_counts=not self.job.filters,
            compression=compression,
            level=level,
            storage_options=storage_options,
        )
        self.spec = spec
        self.completed_before = prepare_output(spec)
        done = set(self.completed_before)
        cuts = [spec.bounds(k)[0] for k in range(num_shards)]
        n, ranges = split_ranges(self.job, cuts, records_per_range)
        starts = spec.starts()
        self._ranges = [r for r in ranges if spec.shard_of(r[0], starts) not in done]

    def expand(self, pbegin: Any) -> Any:
        written = (
            pbegin
            | "Ranges" >> beam.Create(self._ranges)
            | "ReadBlocks" >> beam.ParDo(_ReadBlock(self.job, self.spec))
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShard" >> beam.ParDo(_WriteBlocks(self.spec))
        )
        return _commit(written, self.spec)
