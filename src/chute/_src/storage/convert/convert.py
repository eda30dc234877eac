"""`convert`: copy records from any supported format into `.crec` (or ArrayRecord)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chute._src.core.errors import DataError
from chute._src.core.progress import Progress
from chute._src.storage.convert.inputs import ARRAY_RECORD_SUFFIXES, Format, detect_format
from chute._src.storage.convert.prepare import RecordJob, check_transforms
from chute._src.storage.formats._paths import expand_paths
from chute._src.storage.records import staging
from chute._src.storage.records.checksum import crc32c
from chute._src.storage.records.layout import HEADER_MAGIC
from chute._src.storage.records.manifest import (
    MANIFEST_NAME,
    existing_shards,
    manifest_shard_format,
    read_manifest,
)
from chute._src.storage.records.writer import RecordWriter, ShardedRecordWriter
from chute._src.storage.remote.calls import call
from chute._src.storage.remote.urls import StorageOptions, filesystem, is_url, local_path

__all__ = [
    "ConvertResult",
    "check_overlap",
    "convert",
    "crec_options",
    "input_bytes",
    "output_format",
]

COMPRESSIONS = ("none", "zstd", "zstd-dict")


@dataclass(frozen=True)
class ConvertResult:
    records: int
    bytes_in: int
    bytes_out: int
    seconds: float
    outputs: list[str]
    resumed_records: int = 0


def _fix_overlap(output: Path) -> str:
    new = f"{output}.new"
    return (
        f"write to a new path and swap them yourself once it is checked, e.g. `chute "
        f"convert ... {new}` then `chute verify {new}`, `mv {output} {output}.old`, "
        f"`mv {new} {output}`"
    )


def _read_paths(paths: list[str]) -> tuple[list[str], list[str]]:
    """The real paths of every file the conversion reads, and of input directories."""
    files: list[str] = []
    dirs: list[str] = []
    for p in paths:
        if is_url(p):  # a remote input never overlaps a local output; remote outputs
            continue  # are written locally first (see `_convert_to_url`)
        real = os.path.realpath(p)
        if os.path.isdir(real) or os.path.basename(real) == MANIFEST_NAME:
            directory = real if os.path.isdir(real) else os.path.dirname(real)
            dirs.append(directory)
            manifest = Path(directory) / MANIFEST_NAME
            files.append(str(manifest))
            try:
                listed = read_manifest(manifest, manifest_shard_format(manifest))
                files.extend(os.path.realpath(s) for s, _ in listed)
            except DataError:
                pass  # opening the source reports it
        else:
            files.append(real)
    return files, dirs


def _read_set(paths: list[str]) -> frozenset[str]:
    files, dirs = _read_paths(paths)
    return frozenset(files + dirs)


def check_overlap(paths: list[str], output: Path) -> None:
    """Refuses when the output is, contains or lies inside what is read."""
    out = os.path.realpath(output)
    files, dirs = _read_paths(paths)
    inside = out.rstrip(os.sep) + os.sep
    clashes: list[str] = []
    for f in dirs + files:
        if f == out:
            clashes.append(f"the input {f} is the output")
        elif f.startswith(inside):
            clashes.append(f"the input {f} is inside the output {out}")
    for d in dirs:
        if out.startswith(d.rstrip(os.sep) + os.sep) and not d.startswith(inside):
            clashes.append(f"the output {out} is inside the input dataset {d}")
    if os.path.isfile(out):
        st = os.stat(out)
        for f in files:
            with contextlib.suppress(OSError):
                other = os.stat(f)
                if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino) and f != out:
                    clashes.append(f"the output {out} is a hard link of the input {f}")
    if clashes:
        shown = "; ".join(dict.fromkeys(clashes[:5]))
        more = f" (and {len(clashes) - 5} more)" if len(clashes) > 5 else ""
        raise ValueError(
            f"the output overlaps the inputs: {shown}{more}. chute convert never writes "
            f"where it reads; {_fix_overlap(output)}"
        )


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _check_output(
    output: Path, single_file: bool, fmt: Format, overwrite: bool, resume: bool
) -> None:
    """Refuses outputs chute cannot write without touching what it did not write."""
    if single_file:
        if output.is_dir():
            raise FileExistsError(
                f"{output} is a directory; with a file suffix and one shard chute writes a "
                "single file, and never replaces a directory: give another file name, or "
                "--shards N to write a dataset into a directory"
            )
        if os.path.lexists(output) and not overwrite:
            raise FileExistsError(f"{output} exists; pass --overwrite to replace it")
        return
    if not os.path.lexists(output):
        return
    if not output.is_dir():
        raise FileExistsError(
            f"{output} exists and is not a directory; a sharded output is a directory: "
            "give a new directory name"
        )
    entries = sorted(p.name for p in output.iterdir())
    if fmt is Format.ARRAY_RECORD:
        ours = [n for n in entries if n.endswith(ARRAY_RECORD_SUFFIXES)]
        if ours:
            raise FileExistsError(
                f"{output} already holds ArrayRecord files ({_listing(ours)}); chute writes no "
                "manifest for ArrayRecord shards, so it cannot tell its files from yours and "
                "replaces none: remove them yourself, or write to a new directory"
            )
    elif (output / MANIFEST_NAME).exists() or os.path.lexists(output / MANIFEST_NAME):
        existing_shards(output)  # refuses a manifest.json that is not chute's
        if not overwrite:
            raise FileExistsError(
                f"{output} exists; pass --overwrite to replace it (chute removes only the "
                "shards its manifest lists, after the new dataset is in place)"
            )
        return
    if entries and not (overwrite or resume):
        if any(staging.Journal.pattern("part").fullmatch(n) for n in entries):
            raise FileExistsError(
                f"{output} holds what an interrupted chute convert left ({_listing(entries)}); "
                "pass --resume to keep its complete shards (same inputs and options), or "
                "--overwrite to start again (chute removes only what it can prove it wrote)"
            )
        raise FileExistsError(
            f"{output} exists and holds files but no chute manifest ({_listing(entries)}); "
            "pass --overwrite to write the dataset beside them (chute deletes none of "
            "them), or give a new directory"
        )


def crec_options(compression: str, level: int) -> dict[str, Any]:
    if compression not in COMPRESSIONS:
        raise ValueError(f"--compress {compression!r} is unknown; use one of {COMPRESSIONS}")
    if compression == "none":
        return {}
    return {"compression": "zstd", "level": level, "train_dictionary": compression == "zstd-dict"}


class _ArrayRecordOut:
    """Writes ArrayRecord files atomically (temporary name, then rename)."""

    def __init__(
        self,
        output: Path,
        shards: int,
        sizes: list[int] | None,
        compression: str,
        inputs: frozenset[str],
    ) -> None:
        from chute._src.storage.formats.array_record import _module

        self._module = _module()
        self._options = "group_size:1," + ("uncompressed" if compression == "none" else "zstd:3")
        self._output = output
        self._shards = shards
        self._sizes = sizes  # the records of each shard; None: the caller cuts (end_shard)
        self._writer: Any = None
        self._count = 0
        self._done: list[tuple[Path, Path]] = []
        self._locks: list[Any] = []
        self.outputs: list[str] = []
        if shards > 1:
            output.mkdir(parents=True, exist_ok=True)
        names = r"part-\d{5}-of-\d{5}\.array_record" if shards > 1 else re.escape(output.name)
        pattern = staging.temp_pattern(names)
        magic = (staging.ARRAY_RECORD_MAGIC,)
        staging.sweep_temps(self._target(0).parent, pattern, magic, inputs)

    def _target(self, k: int) -> Path:
        if self._shards == 1:
            return self._output
        return self._output / f"part-{k:05d}-of-{self._shards:05d}.array_record"

    def write(self, record: bytes) -> None:
        while self._writer is None or (
            self._sizes is not None and self._count == self._sizes[len(self._done)]
        ):
            self._finish()
            self._open(self._target(len(self._done)))
        self._writer.write(record)
        self._count += 1

    def _finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._done.append(self._current)
            self._count = 0

    def end_shard(self) -> None:
        """Ends the current shard (an empty one if no record went to it)."""
        if self._writer is None:
            self.write_empty()
        self._finish()

    def close(self) -> None:
        self._finish()
        while len(self._done) < self._shards:  # every shard is there, empty or not
            self.write_empty()
            self._finish()
        for tmp, target in self._done:
            os.replace(tmp, target)
            self.outputs.append(str(target))
        self._unlock()

    def _unlock(self) -> None:
        for f in self._locks:
            f.close()
        self._locks = []

    def write_empty(self) -> None:
        self._open(self._target(len(self._done)))

    def _open(self, target: Path) -> None:
        tmp = staging.temp_name(target)
        self._locks.append(staging.create_locked(tmp))  # held until renamed; see staging.py
        self._writer = self._module.ArrayRecordWriter(str(tmp), self._options)
        self._current = (tmp, target)

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._done.append(self._current)
        for tmp, _ in self._done:
            tmp.unlink(missing_ok=True)
        self._unlock()


def output_format(out: Path, to_format: Format | None) -> Format:
    """The format to write: `to_format`, else the one `out`'s suffix names, else crec."""
    if to_format is None:
        try:
            to_format = detect_format(out) if out.suffix else Format.CREC
        except ValueError:
            to_format = Format.CREC
    if to_format not in (Format.CREC, Format.ARRAY_RECORD):
        raise ValueError(f"chute convert writes crec or arrayrecord, not {to_format.value}")
    return to_format


def convert(
    inputs: list[str],
    output: str,
    *,
    from_format: Format | None = None,
    to_format: Format | None = None,
    shards: int = 1,
    compression: str = "none",
    level: int = 3,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
    transforms: Sequence[Any] = (),
    seed: int | None = None,
    storage_options: StorageOptions = None,
) -> ConvertResult:
    """Converts `inputs` (all of one format) into `output`; see `chute convert --help`.

    Every output file is written atomically, and nothing is written where anything is
    read: an output that is, contains or lies inside an input is refused. A sharded
    `.crec` output replaces an existing dataset (with `overwrite=True`) as
    `ShardedRecordWriter` does: new shards, then the manifest, then the old shards that
    manifest listed are removed; other files in the directory are never touched. With
    `resume=True` a sharded `.crec` conversion keeps the complete shards an interrupted
    run of the same job (same inputs, unchanged, and options) left behind and writes
    only the rest.

    `transforms` (element-wise: `chute.transforms.Map`, `RandomMap`, `Filter`,
    `MapWithIndex`, or plain functions) preprocess every record as the online pipeline
    `MapDataset.source(source).seed(seed).apply(transforms)` would (see
    `_src/storage/convert/prepare.py`); the last must return bytes, and a filtered position
    writes nothing.
    """
    if shards < 1:
        raise ValueError(f"--shards {shards} is invalid; give 1 or more")
    so = storage_options
    paths = expand_paths(inputs, "chute convert", so)
    if is_url(output):
        return _convert_to_url(
            paths,
            output,
            so,
            resume=resume,
            overwrite=overwrite,
            kwargs=dict(
                from_format=from_format,
                to_format=to_format,
                shards=shards,
                compression=compression,
                level=level,
                progress=progress,
                transforms=transforms,
                seed=seed,
                storage_options=so,
            ),
        )
    output = local_path(output)
    if from_format is None:
        found = {detect_format(p, so) for p in paths}
        if len(found) > 1:
            names = ", ".join(sorted(f.value for f in found))
            raise ValueError(f"the inputs mix formats ({names}); convert them separately")
        from_format = found.pop()
    out = Path(output)
    to_format = output_format(out, to_format)
    single_file = shards == 1 and out.suffix in (".crec", *ARRAY_RECORD_SUFFIXES)
    if resume and (single_file or to_format is not Format.CREC):
        raise ValueError(
            "--resume works for sharded .crec output (a directory, with --shards N); a "
            "single file is written atomically, so just run the conversion again"
        )
    check_overlap(paths, out)
    _check_output(out, single_file, to_format, overwrite, resume)
    record_job = RecordJob(
        tuple(paths), from_format, check_transforms(transforms), seed, storage_options=so
    )
    if resume and record_job.filters:
        raise ValueError(
            "--resume cannot skip what an interrupted run wrote when a Filter drops records "
            "(written records no longer count input positions); convert again into a new "
            "directory, or use the Beam runner, whose shards are fixed by input position"
        )
    source = record_job.open()
    metadata = source.metadata
    n = len(source)
    # Shards as chute.beam lays them out: shard k holds positions [k*n//S, (k+1)*n//S),
    # named part-00003-of-00016. Without a Filter the writer cuts them by record count
    # (which lets --resume check the shards it keeps); with one, records are fewer than
    # positions, so the loop below cuts each shard where its positions end.
    layout = None if record_job.filters else n
    count = 1 if single_file else shards
    cuts = count > 1 and layout is None
    if not single_file and to_format is Format.CREC:
        job = [
            [p] if is_url(p) else [os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns]
            for p in paths
        ]
        parts: list[Any] = [job, from_format.value, compression, level, [shards, n]]
        if transforms:
            parts.append(record_job.fingerprint())
        metadata = {**metadata, "job": f"{crc32c(json.dumps(parts).encode()):08x}"}
    writer: Any
    if to_format is Format.ARRAY_RECORD:
        sizes = None if cuts else _layout(n, count)
        writer = _ArrayRecordOut(out, count, sizes, compression, _read_set(paths))
    elif single_file:
        pattern = staging.temp_pattern(re.escape(out.name))
        staging.sweep_temps(out.parent, pattern, (HEADER_MAGIC,), _read_set(paths))
        writer = RecordWriter(out, metadata=metadata, **crec_options(compression, level))
    else:
        writer = ShardedRecordWriter(
            out,
            num_shards=shards,
            num_records=layout,
            metadata=metadata,
            resume=resume,
            **crec_options(compression, level),
        )
    skip = len(writer) if isinstance(writer, ShardedRecordWriter) else 0
    start = time.perf_counter()
    bar: Progress[Any] = Progress(total=n, desc="convert", force=progress)
    bar.update(skip)
    segments = [(k * n // count, (k + 1) * n // count) for k in range(count)] if cuts else []
    try:
        for lo, hi in segments or [(skip, n)]:
            for positions, block in source.blocks(lo, hi):
                nbytes = 0
                for record in block:
                    writer.write(record)
                    nbytes += len(record)
                bar.update(positions, nbytes)
            if cuts:
                writer.end_shard()
        writer.close()
    except BaseException as e:
        if isinstance(writer, ShardedRecordWriter):
            # Ctrl-C keeps the complete shards for --resume; a failure removes them.
            writer.abort(keep_shards=isinstance(e, KeyboardInterrupt))
        else:
            writer.abort()
        raise
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    if to_format is Format.ARRAY_RECORD:
        outputs = writer.outputs
        written = [Path(p) for p in outputs]
    elif single_file:
        outputs = [str(out)]
        written = [out]
    else:
        outputs = [str(out)]
        written = [out / name for name in [*writer.shards, MANIFEST_NAME]]
    bytes_out = sum(p.stat().st_size for p in written)
    return ConvertResult(n, input_bytes(paths, so), bytes_out, seconds, outputs, skip)


def _layout(n: int, shards: int) -> list[int]:
    """The records of each shard: positions `[k*n//S, (k+1)*n//S)`, as `chute.beam`'s."""
    return [(k + 1) * n // shards - k * n // shards for k in range(shards)]


def input_bytes(paths: list[str], storage_options: StorageOptions = None) -> int:
    """What `bytes in` counts, for every runner: the size of every file the conversion
    reads (a dataset directory's manifest and the shards it lists; a URL's object)."""
    total = 0
    for p in paths:
        if is_url(p):  # one request per input: the object's size, or a directory's total
            fs, fspath = filesystem(p, storage_options)
            info = call(p, "find its size", functools.partial(fs.info, fspath))
            if info.get("type") == "directory":
                total += int(call(p, "find its size", functools.partial(fs.du, fspath)))
            else:
                total += int(info.get("size") or 0)
    files, _ = _read_paths(paths)
    for f in dict.fromkeys(files):
        with contextlib.suppress(OSError):  # a listed shard that is missing: the read said so
            total += os.path.getsize(f)
    return total


def _convert_to_url(
    paths: list[str],
    output: str,
    storage_options: StorageOptions,
    *,
    resume: bool,
    overwrite: bool,
    kwargs: dict[str, Any],
) -> ConvertResult:
    """`convert` into a local temporary directory, then uploaded: the shards first, the
    manifest last, each object appearing whole (a PUT is atomic), so a reader never sees
    a manifest whose shards are missing."""
    if resume:
        raise ValueError(
            f"--resume works for local output; {output} is a URL: run the conversion again "
            "(nothing appears there until every file is uploaded)"
        )
    fs, fspath = filesystem(output, storage_options)
    if call(output, "look for it", lambda: fs.exists(fspath)) and not overwrite:
        raise FileExistsError(f"{output} exists; pass --overwrite to replace it")
    name = output.rstrip("/").rsplit("/", 1)[-1]
    with tempfile.TemporaryDirectory(prefix="chute-convert-") as tmp:
        local = os.path.join(tmp, name)
        r = convert(paths, local, **kwargs)
        files = sorted(Path(local).rglob("*")) if os.path.isdir(local) else [Path(local)]
        files = [f for f in files if f.is_file() and f.name != MANIFEST_NAME] + [
            f for f in files if f.name == MANIFEST_NAME
        ]
        is_dir = os.path.isdir(local)
        for f in files:
            rel = os.path.relpath(f, local) if is_dir else ""
            target = f"{output.rstrip('/')}/{rel}" if rel else output
            tpath = f"{fspath.rstrip('/')}/{rel}" if rel else fspath
            call(target, "upload it", functools.partial(fs.put_file, str(f), tpath))
        outputs = [
            f"{output.rstrip('/')}/{os.path.relpath(o, local)}" if is_dir and o != local else output
            for o in r.outputs
        ]
    return ConvertResult(r.records, r.bytes_in, r.bytes_out, r.seconds, outputs, r.resumed_records)
