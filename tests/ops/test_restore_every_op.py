"""Every operation restores exactly under worker processes.

Each case is a small pipeline around one operation (every chain method of `MapDataset`
and `IterDataset`, and the stages of `chute.experimental`), whose work sits below
`mp_prefetch(MultiprocessingOptions(num_workers=w))` for w in 0, 1 and 3. The shared
restore helper (`chute.testing.assert_equal_output_after_checkpoint`) checks that a state
taken at every step restores exactly into the same pipeline, and that a state taken with
w workers restores into the pipeline run with another count (`restore_into`).

The functions and classes a pipeline uses are defined inside its builder: cloudpickle
sends them to the workers by value (a test module is not importable there by name).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute
from chute import experimental as ex
from chute.testing import assert_equal_output_after_checkpoint

# A state taken with w workers is also restored into the pipeline run with OTHER[w].
OTHER = {0: 3, 1: 0, 3: 1}

Build = Callable[[Path], chute.IterDataset[Any]]


# -- MapDataset's chain ------------------------------------------------------------------


def _range(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(3, 40, 4).to_iter_dataset()


def _map(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(9).map(lambda x: x * 3).to_iter_dataset()


def _map_with_index(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(5, 14).map_with_index(lambda i, x: (i, x)).to_iter_dataset()


def _random_map(_: Path) -> chute.IterDataset[Any]:
    ds = chute.MapDataset.range(9).random_map(lambda x, rng: x * 1000 + rng.integers(1000), seed=7)
    return ds.to_iter_dataset()


def _filter(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(14).filter(lambda x: x % 3 != 1).to_iter_dataset()


def _batch(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(20).batch(3).to_iter_dataset()


def _batch_padding(_: Path) -> chute.IterDataset[Any]:
    ds = chute.MapDataset.range(1, 10).map(lambda n: {"t": np.arange(n % 4 + 1)})
    return ds.batch(3, pad_value=-1).to_iter_dataset()


def _batch_and_pad(_: Path) -> chute.IterDataset[Any]:
    def fn(values: list[int]) -> Any:
        return ex.batch_and_pad(values, batch_size=4, pad_value=-1)

    return chute.MapDataset.range(10).batch(4, batch_fn=fn).to_iter_dataset()


def _flat_map(_: Path) -> chute.IterDataset[Any]:
    class Split(ex.FlatMapTransform):
        max_fan_out = 3

        def flat_map(self, element: int) -> list[int]:
            return [element * 10 + j for j in range(element % 3 + 1)]

    return ex.FlatMapMapDataset(chute.MapDataset.range(5), Split()).to_iter_dataset()


def _shuffle(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(10).shuffle(seed=3).to_iter_dataset()


def _slice(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(30).slice(slice(3, 25, 3)).to_iter_dataset()


def _getitem_slice(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(30)[20:2:-4].to_iter_dataset()


def _repeat(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(4).shuffle(seed=1).repeat(3).to_iter_dataset()


def _seed(_: Path) -> chute.IterDataset[Any]:
    ds = chute.MapDataset.range(8).seed(5).shuffle()
    return ds.random_map(lambda x, rng: (x, rng.integers(100))).to_iter_dataset()


def _mix(_: Path) -> chute.IterDataset[Any]:
    a, b = chute.MapDataset.range(6), chute.MapDataset.range(100, 106)
    return chute.MapDataset.mix([a, b], [2, 1]).to_iter_dataset()


def _select_from_datasets(_: Path) -> chute.IterDataset[Any]:
    a, b = chute.MapDataset.range(4), chute.MapDataset.range(100, 103)
    picks = [(0, 0), (1, 2), (0, 3), (1, 0), (0, 1), (1, 1), (0, 2)]
    return chute.MapDataset.select_from_datasets([a, b], picks).to_iter_dataset()


def _concatenate(_: Path) -> chute.IterDataset[Any]:
    parts = [chute.MapDataset.range(3), chute.MapDataset.range(10, 15), chute.MapDataset.range(7)]
    return chute.MapDataset.concatenate(parts).to_iter_dataset()


def _zip_map(_: Path) -> chute.IterDataset[Any]:
    a = chute.MapDataset.range(8)
    return ex.ZipMapDataset([a, a.map(lambda x: -x)]).to_iter_dataset()


def _window_shuffle_map(_: Path) -> chute.IterDataset[Any]:
    ds = ex.WindowShuffleMapDataset(chute.MapDataset.range(11), window_size=4, seed=2)
    return ds.to_iter_dataset()


def _cache_map(_: Path) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(6).map(lambda x: x * x).cache().repeat(2).to_iter_dataset()


def _apply(_: Path) -> chute.IterDataset[Any]:
    class AddOne(chute.transforms.Map):
        def map(self, x: int) -> int:
            return x + 1

    ds = chute.MapDataset.range(9).apply([AddOne(), chute.transforms.Batch(2)])
    return ds.to_iter_dataset()


def _source(_: Path) -> chute.IterDataset[Any]:
    words = ["a", "bb", "ccc", "dddd", "ee", "f", "ggg"]
    return chute.MapDataset.source(words).map(len).to_iter_dataset()


# -- IterDataset's chain -----------------------------------------------------------------


def _numbers(n: int = 12) -> chute.IterDataset[int]:
    return chute.MapDataset.range(n).to_iter_dataset()


def _iter_map(_: Path) -> chute.IterDataset[Any]:
    return _numbers().map(lambda x: x + 100)


def _iter_map_with_index(_: Path) -> chute.IterDataset[Any]:
    return _numbers().filter(lambda x: x % 2 == 0).map_with_index(lambda i, x: (i, x))


def _iter_random_map(_: Path) -> chute.IterDataset[Any]:
    return _numbers(9).random_map(lambda x, rng: x * 1000 + rng.integers(1000), seed=4)


def _iter_filter(_: Path) -> chute.IterDataset[Any]:
    return _numbers(15).filter(lambda x: x % 4 != 2)


def _iter_batch(_: Path) -> chute.IterDataset[Any]:
    return _numbers(14).filter(lambda x: x != 5).batch(4)


def _iter_batch_padding(_: Path) -> chute.IterDataset[Any]:
    ds = _numbers(10).map(lambda n: np.arange(n % 5))
    return ds.batch(3, padding_struct=4)


def _iter_flat_map(_: Path) -> chute.IterDataset[Any]:
    class Pieces(ex.FlatMapTransform):
        max_fan_out = None

        def flat_map(self, element: int) -> list[int]:
            return list(range(element % 4))

    return ex.FlatMapIterDataset(_numbers(8), Pieces())


def _iter_repeat(_: Path) -> chute.IterDataset[Any]:
    return _numbers(4).map(lambda x: -x).repeat(3)


def _iter_seed(_: Path) -> chute.IterDataset[Any]:
    return _numbers(8).seed(11).random_map(lambda x, rng: (x, rng.integers(50)))


def _iter_mix(_: Path) -> chute.IterDataset[Any]:
    a, b = _numbers(6), chute.MapDataset.range(50, 58).to_iter_dataset()
    return chute.IterDataset.mix({"a": a, "b": b}, {"a": 1.0, "b": 2.0})


def _iter_zip(_: Path) -> chute.IterDataset[Any]:
    return ex.ZipIterDataset([_numbers(7), _numbers(9).map(lambda x: x * 2)], strict=False)


def _window_shuffle_iter(_: Path) -> chute.IterDataset[Any]:
    return ex.WindowShuffleIterDataset(_numbers(11), window_size=3, seed=5)


def _interleave(_: Path) -> chute.IterDataset[Any]:
    files = [chute.MapDataset.range(k * 10, k * 10 + 2 + k).to_iter_dataset() for k in range(4)]
    return ex.InterleaveIterDataset(files, cycle_length=2)


def _limit(_: Path) -> chute.IterDataset[Any]:
    return _numbers(20).filter(lambda x: x % 3 != 0).limit(7)


def _rebatch(_: Path) -> chute.IterDataset[Any]:
    return ex.RebatchIterDataset(_numbers(20).batch(3), batch_size=5)


def _sequences() -> chute.IterDataset[dict[str, np.ndarray]]:
    lengths = [3, 5, 2, 6, 1, 4, 4, 2, 7, 3]
    seqs = [{"t": np.arange(1, n + 1) + 10 * i} for i, n in enumerate(lengths)]
    return chute.MapDataset.source(seqs).to_iter_dataset()


def _pack_first_fit(_: Path) -> chute.IterDataset[Any]:
    return ex.FirstFitPackIterDataset(
        _sequences(), length_struct={"t": 8}, num_packing_bins=2, seed=1
    )


def _pack_best_fit(_: Path) -> chute.IterDataset[Any]:
    return ex.BestFitPackIterDataset(
        _sequences(), length_struct={"t": 8}, num_packing_bins=3, shuffle_bins=False
    )


def _concat_then_split(_: Path) -> chute.IterDataset[Any]:
    return ex.ConcatThenSplitIterDataset(_sequences(), length_struct={"t": 6})


def _batch_by_tokens(_: Path) -> chute.IterDataset[Any]:
    return _sequences().batch_by_tokens(12, length_fn=lambda e: len(e["t"]), window_size=4, seed=2)


def _bucket_by_sequence_length(_: Path) -> chute.IterDataset[Any]:
    return _sequences().bucket_by_sequence_length(
        lambda e: len(e["t"]), [3, 5], [3, 2, 1], pad_to_bucket_boundary=False, window_size=5
    )


def _even_batches(_: Path) -> chute.IterDataset[Any]:
    return _numbers(11).batch(3).even_batches(3)


def _iter_cache(_: Path) -> chute.IterDataset[Any]:
    return _numbers(5).map(lambda x: x * 7).cache().repeat(2)


def _disk_cache(tmp: Path) -> chute.IterDataset[Any]:
    return _numbers(6).map(lambda x: {"x": x, "y": np.full(2, x)}).cache(tmp / "cache").repeat(2)


def _iterable_source(_: Path) -> chute.IterDataset[Any]:
    return chute.IterDataset.source(lambda: iter(range(30, 39))).map(lambda x: x - 30)


def _iter_apply(_: Path) -> chute.IterDataset[Any]:
    class Odd(chute.transforms.Filter):
        def filter(self, x: int) -> bool:
            return x % 2 == 1

    return _numbers(13).apply([Odd(), chute.transforms.Batch(2)])


def _thread_prefetch(_: Path) -> chute.IterDataset[Any]:
    return ex.ThreadPrefetchIterDataset(_numbers(9).map(lambda x: x + 1), prefetch_buffer_size=2)


def _prefetch(_: Path) -> chute.IterDataset[Any]:
    return _numbers(9).map(lambda x: x * 2).prefetch(3)


def _multithread_prefetch(_: Path) -> chute.IterDataset[Any]:
    return ex.multithread_prefetch(_numbers(9).map(lambda x: x - 1), num_threads=2, buffer_size=2)


def _with_options(_: Path) -> chute.IterDataset[Any]:
    options = ex.DatasetOptions(filter_raise_threshold_ratio=0.9)
    return ex.WithOptionsIterDataset(_numbers(10).filter(lambda x: x % 3 != 0), options)


def _text_files(tmp: Path) -> list[str]:
    paths = []
    for f, count in enumerate((3, 0, 5, 2)):
        path = tmp / f"part-{f}.jsonl"
        path.write_text("".join(f'{{"f": {f}, "i": {i}}}\n' for i in range(count)))
        paths.append(str(path))
    return paths


def _jsonl_stream(tmp: Path) -> chute.IterDataset[Any]:
    return ex.JsonlIterDataset(_text_files(tmp), cycle_length=2)


def _lines_stream(tmp: Path) -> chute.IterDataset[Any]:
    return ex.FileLinesIterDataset(_text_files(tmp), parse=len).batch(2)


def _mp_prefetch(_: Path) -> chute.IterDataset[Any]:
    # mp_prefetch itself: the plain pipeline, whose map and filter move into the workers.
    return chute.MapDataset.range(12).shuffle(seed=9).map(lambda x: x * 5).to_iter_dataset()


CASES: dict[str, Build] = {
    "range": _range,
    "map": _map,
    "map_with_index": _map_with_index,
    "random_map": _random_map,
    "filter": _filter,
    "batch": _batch,
    "batch_padding": _batch_padding,
    "batch_and_pad": _batch_and_pad,
    "flat_map": _flat_map,
    "shuffle": _shuffle,
    "slice": _slice,
    "getitem_slice": _getitem_slice,
    "repeat": _repeat,
    "seed": _seed,
    "mix": _mix,
    "select_from_datasets": _select_from_datasets,
    "concatenate": _concatenate,
    "zip": _zip_map,
    "window_shuffle": _window_shuffle_map,
    "cache": _cache_map,
    "apply": _apply,
    "source": _source,
    "iter_map": _iter_map,
    "iter_map_with_index": _iter_map_with_index,
    "iter_random_map": _iter_random_map,
    "iter_filter": _iter_filter,
    "iter_batch": _iter_batch,
    "iter_batch_padding": _iter_batch_padding,
    "iter_flat_map": _iter_flat_map,
    "iter_repeat": _iter_repeat,
    "iter_seed": _iter_seed,
    "iter_mix": _iter_mix,
    "iter_zip": _iter_zip,
    "iter_window_shuffle": _window_shuffle_iter,
    "interleave": _interleave,
    "limit": _limit,
    "rebatch": _rebatch,
    "pack_first_fit": _pack_first_fit,
    "pack_best_fit": _pack_best_fit,
    "concat_then_split": _concat_then_split,
    "batch_by_tokens": _batch_by_tokens,
    "bucket_by_sequence_length": _bucket_by_sequence_length,
    "even_batches": _even_batches,
    "iter_cache": _iter_cache,
    "disk_cache": _disk_cache,
    "iterable_source": _iterable_source,
    "iter_apply": _iter_apply,
    "thread_prefetch": _thread_prefetch,
    "prefetch": _prefetch,
    "multithread_prefetch": _multithread_prefetch,
    "with_options": _with_options,
    "jsonl_stream": _jsonl_stream,
    "lines_stream": _lines_stream,
    "mp_prefetch": _mp_prefetch,
}


def _under_workers(build: Build, tmp: Path, workers: int) -> chute.IterDataset[Any]:
    return build(tmp).mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))


# By design these cannot run in workers: mp_prefetch runs them in this process, says so
# in a warning, and their states restore all the same.
IN_THIS_PROCESS = {
    "iterable_source": "an iterable is one stream with no random-access part and no shards "
    "for workers to read",
}


@pytest.mark.parametrize(
    "workers", [0, 1, pytest.param(3, marks=pytest.mark.slow)], ids=lambda w: f"{w}w"
)
@pytest.mark.parametrize("op", list(CASES))
def test_every_step_restores_and_crosses_worker_counts(
    op: str, workers: int, tmp_path: Path
) -> None:
    build = CASES[op]
    ds = _under_workers(build, tmp_path, workers)
    other = _under_workers(build, tmp_path, OTHER[workers])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_equal_output_after_checkpoint(ds)
        assert_equal_output_after_checkpoint(ds, restore_into=other)
    in_process = [w for w in caught if "runs in this process" in str(w.message)]
    # Every other case has work for the workers: none is quietly run here instead.
    assert bool(in_process) == (op in IN_THIS_PROCESS), [str(w.message) for w in in_process]


def test_the_cases_cover_every_chain_method() -> None:
    """A chain method added to MapDataset or IterDataset needs its case here."""
    covered = {name.removeprefix("iter_") for name in CASES}
    not_operations = {"pipe", "to_iter_dataset", "make_iterator", "as_map_stage", "parents"}
    for cls in (chute.MapDataset, chute.IterDataset):
        methods = {
            name
            for name, value in vars(cls).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, staticmethod))
        }
        missing = methods - covered - not_operations
        assert not missing, f"{cls.__name__}: no restore case for {sorted(missing)}"


# The stages of chute.experimental, and the case that runs each (or why none does).
EXPERIMENTAL = {
    "BatchByTokensIterDataset": "batch_by_tokens",
    "BestFitPackIterDataset": "pack_best_fit",
    "BucketBySequenceLengthIterDataset": "bucket_by_sequence_length",
    "CacheIterDataset": "iter_cache",
    "CacheMapDataset": "cache",
    "ConcatThenSplitIterDataset": "concat_then_split",
    "DiskCacheIterDataset": "disk_cache",
    "EvenBatchesIterDataset": "even_batches",
    "FileLinesIterDataset": "lines_stream",
    "FirstFitPackIterDataset": "pack_first_fit",
    "FlatMapIterDataset": "iter_flat_map",
    "FlatMapMapDataset": "flat_map",
    "InterleaveIterDataset": "interleave",
    "JsonlIterDataset": "jsonl_stream",
    "LimitIterDataset": "limit",
    "RebatchIterDataset": "rebatch",
    "RepeatIterDataset": "iter_repeat",
    "ThreadPrefetchIterDataset": "thread_prefetch",
    "WindowShuffleIterDataset": "iter_window_shuffle",
    "WindowShuffleMapDataset": "window_shuffle",
    "WithOptionsIterDataset": "with_options",
    "ZipIterDataset": "iter_zip",
    "ZipMapDataset": "zip",
    "apply_transformations": "apply",
    "batch_and_pad": "batch_and_pad",
    "multithread_prefetch": "multithread_prefetch",
}
NOT_HERE = {
    # Sources of other formats: the same stream stage as JsonlIterDataset over another
    # reader; their restores in workers are in tests/exec/test_stream_workers.py and
    # tests/storage/.
    "ParquetIterDataset": "a file source (tests/storage/test_sources_parquet.py)",
    "TFRecordIterDataset": "a file source (tests/storage/test_sources_tfrecord.py)",
    # By design not a stage below workers: it puts batches on JAX devices in the
    # consumer's process, after every other stage (tests/frameworks/test_device_put.py).
    "device_put": "runs last, on the consumer's devices",
    # Not a dataset: an iterator over global batches that restores with another host
    # count (tests/frameworks/test_elastic.py runs it over mp_prefetch).
    "ElasticIterator": "an iterator, not a stage",
}


def test_the_cases_cover_every_experimental_stage() -> None:
    """A stage added to chute.experimental needs its case here, or a reason in NOT_HERE."""
    stages = {
        name
        for name in ex.__all__
        if name.endswith(("IterDataset", "MapDataset"))
        or name in ("apply_transformations", "batch_and_pad", "multithread_prefetch")
        or name in NOT_HERE
    }
    missing = stages - EXPERIMENTAL.keys() - NOT_HERE.keys()
    assert not missing, f"no restore case for chute.experimental.{sorted(missing)}"
    assert set(EXPERIMENTAL.values()) <= CASES.keys()
