"""Two `mp_prefetch` stages in one pipeline: the outer one runs the whole pipeline below it
in its workers and the inner one hands its input on, so the elements and the states are
those of the same pipeline with no workers (issue 47, defect 7: the inner one used to
re-read the outer one's rewritten readers and drop the filter moved into the workers, or
fail to pickle the outer one's shards)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

import chute
import mp_pipelines as mpp
import shard_helpers as sh
from chute.experimental import JsonlIterDataset
from chute.testing import assert_equal_output_after_checkpoint


def _opts(workers: int) -> chute.MultiprocessingOptions:
    return chute.MultiprocessingOptions(num_workers=workers)


def _mapped(inner: int, outer: int) -> chute.IterDataset[Any]:
    ds = chute.MapDataset.range(60).shuffle(seed=3).map(mpp.double).to_iter_dataset()
    return ds.filter(mpp.keep).mp_prefetch(_opts(inner)).batch(4).mp_prefetch(_opts(outer))


def _write_jsonl(tmp_path: Path, counts: list[int]) -> list[str]:
    paths = []
    for f, n in enumerate(counts):
        path = tmp_path / f"shard-{f:02d}.jsonl"
        path.write_text("".join(json.dumps({"shard": f, "row": r}) + "\n" for r in range(n)))
        paths.append(str(path))
    return paths


def _jsonl(paths: list[str], inner: int, outer: int) -> chute.IterDataset[Any]:
    ds = JsonlIterDataset(paths, cycle_length=3).map(sh.key).filter(sh.keep)
    return ds.mp_prefetch(_opts(inner)).mp_prefetch(_opts(outer))


@pytest.mark.parametrize("workers", [1, 2])
def test_nested_mp_prefetch_keeps_the_filter(workers: int) -> None:
    ds = chute.MapDataset.range(30).to_iter_dataset().filter(mpp.keep)
    nested = ds.mp_prefetch(_opts(workers)).mp_prefetch(_opts(workers))
    assert mpp.as_list(nested) == [x for x in range(30) if mpp.keep(x)]


@pytest.mark.parametrize(("inner", "outer"), [(1, 1), (2, 2), (1, 2), (2, 0), (0, 2)])
def test_nested_mp_prefetch_over_a_map_dataset_as_with_no_workers(inner: int, outer: int) -> None:
    reference = mpp.as_list(_mapped(0, 0))
    assert [b.tolist() for b in mpp.as_list(_mapped(inner, outer))] == [
        b.tolist() for b in reference
    ]
    assert_equal_output_after_checkpoint(
        _mapped(inner, outer), restore_into=_mapped(outer, 0), steps=[0, 1, 5, len(reference)]
    )


@pytest.mark.parametrize(("inner", "outer"), [(1, 1), (2, 2), (2, 1)])
def test_nested_mp_prefetch_over_a_shard_stream_as_with_no_workers(
    tmp_path: Path, inner: int, outer: int
) -> None:
    paths = _write_jsonl(tmp_path, [5, 0, 23, 9, 1, 17])
    reference = mpp.as_list(_jsonl(paths, 0, 0))
    assert reference and len(reference) < 55  # the filter dropped some
    assert mpp.as_list(_jsonl(paths, inner, outer)) == reference
    assert_equal_output_after_checkpoint(
        _jsonl(paths, inner, outer), restore_into=_jsonl(paths, 1, 2), steps=[0, 3, 20, 36]
    )


def test_an_inner_worker_init_fn_that_cannot_run_is_named(tmp_path: Path) -> None:
    ds = chute.MapDataset.range(10).to_iter_dataset()
    init = mpp.WriteMarker(tmp_path)
    inner = ds.mp_prefetch(_opts(1), worker_init_fn=init)
    with pytest.warns(UserWarning, match=r"worker_init_fn.*inner mp_prefetch.*outer") as seen:
        nested = inner.mp_prefetch(_opts(1))
    assert seen[0].filename == __file__  # the warning points at the user's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mpp.as_list(nested) == list(range(10))
    assert not list(tmp_path.iterdir())
    plain = ds.mp_prefetch(_opts(1)).mp_prefetch(_opts(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mpp.as_list(plain) == list(range(10))
