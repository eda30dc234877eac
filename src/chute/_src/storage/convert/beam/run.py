"""`chute convert --runner beam`: the conversion as one Beam job, run to completion."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chute._src.storage.convert import outputs
from chute._src.storage.convert.convert import (
    ConvertResult,
    check_overlap,
    input_bytes,
    output_format,
)
from chute._src.storage.convert.inputs import Format
from chute._src.storage.formats._paths import expand_paths
from chute._src.storage.records.manifest import MANIFEST_NAME, read_manifest, read_remote_manifest
from chute._src.storage.records.shard_files import dataset_paths
from chute._src.storage.remote.urls import StorageOptions, is_url, local_path

__all__ = ["convert", "pipeline_options"]


def pipeline_options(num_workers: int, args: Sequence[str] = ()) -> Any:
    """Beam's options: the DirectRunner in multi-processing mode with `num_workers`
    worker processes, unless `args` (any Beam pipeline options) say otherwise."""
    from apache_beam.options.pipeline_options import PipelineOptions

    if num_workers < 1:
        raise ValueError(f"--num-workers {num_workers} is invalid; give 1 or more")
    local = [
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={num_workers}",
        "--default_sdk_harness_log_level=WARNING",  # the workers' own INFO lines are noise
    ]
    return PipelineOptions([*local, *args])


def convert(
    inputs: list[str],
    output: str,
    *,
    from_format: Format | str | None = None,
    to_format: Format | str | None = None,
    shards: int = 1,
    compression: str = "none",
    level: int = 3,
    transforms: Sequence[Any] = (),
    seed: int | None = None,
    num_workers: int = 1,
    beam_args: Sequence[str] = (),
    records_per_range: int = 4096,
    quiet: bool = True,
    storage_options: StorageOptions = None,
) -> ConvertResult:
    """Converts `inputs` into a sharded dataset at `output` (a directory) with Beam.

    The same conversion as `chute convert` (same records, in the same global order,
    preprocessed by `transforms` the same way), written as `shards` files named
    `part-00003-of-00016.crec` (`to_format="arrayrecord"`: `.array_record`) plus the
    manifest. Formats are `chute convert`'s names ("tfrecord", "jsonl", ...). The job
    runs on the DirectRunner with `num_workers` processes unless `beam_args` (Beam
    pipeline options, e.g. `--runner=DataflowRunner ...`) say otherwise. Rerunning a
    failed job finishes it: complete shards are kept and only the rest are computed.
    `inputs` and `output` may be URLs (`s3://bucket/prefix`), reached with
    `storage_options` (fsspec's), which travel with the job to every worker.
    """
    import apache_beam as beam

    from chute._src.storage.convert.beam.transforms import ConvertRecords

    if quiet:
        logging.getLogger("apache_beam").setLevel(logging.ERROR)  # its workers chatter
    to = output_format(Path(output), None if to_format is None else Format(to_format))
    paths = expand_paths(inputs, "chute convert", storage_options)
    remote = is_url(output)
    if not remote:
        output = local_path(output)
        check_overlap(paths, Path(output))
    convert_ = ConvertRecords(
        paths,
        output,
        num_shards=shards,
        format=None if from_format is None else Format(from_format),
        to_format=to.value,
        compression=compression,
        level=level,
        transforms=transforms,
        seed=seed,
        records_per_range=records_per_range,
        storage_options=storage_options,
    )
    kept = sum(e.num_records for e in _complete(convert_))
    start = time.perf_counter()
    pipeline = beam.Pipeline(options=pipeline_options(num_workers, beam_args))
    _ = pipeline | "Convert" >> convert_
    result = pipeline.run()
    state = result.wait_until_finish()
    seconds = time.perf_counter() - start
    if state != "DONE":
        raise RuntimeError(f"the Beam job ended in state {state}; rerun it to finish")
    manifest = outputs.join(output, MANIFEST_NAME)
    if remote:
        entries = [e for _, e in read_remote_manifest(manifest, storage_options, to.value)]
    else:
        entries = [e for _, e in read_manifest(Path(manifest), to.value)]
        dataset_paths(output, to.value, "chute convert")  # every shard is the one listed
    records = sum(e.num_records for e in entries)
    bytes_in = input_bytes(list(convert_.job.paths), storage_options)  # as `chute convert`
    manifest_size = len(outputs.read_bytes(manifest, storage_options))
    bytes_out = sum(e.size for e in entries) + manifest_size
    return ConvertResult(records, bytes_in, bytes_out, seconds, [output], kept)


def _complete(c: Any) -> list[Any]:
    from chute._src.storage.convert.beam.shards import complete_entry

    return [e for k in c.completed_before if (e := complete_entry(c.spec, k)) is not None]
