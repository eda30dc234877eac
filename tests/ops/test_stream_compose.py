"""Random chains of the stream stages: restoring at any step continues exactly, and the
output does not depend on the number of reader threads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute import experimental as ex
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


class Halves(ex.FlatMapTransform):
    max_fan_out = 2

    def flat_map(self, element: dict[str, Any]) -> list[dict[str, Any]]:
        t = element["t"]
        return (
            [{"t": t[: len(t) // 2 + 1]}, {"t": t[len(t) // 2 + 1 :]}] if len(t) > 2 else [element]
        )


_STAGES: list[Callable[[chute.IterDataset[Any]], chute.IterDataset[Any]]] = [
    lambda ds: ex.WindowShuffleIterDataset(ds, window_size=4, seed=1),
    lambda ds: ex.FlatMapIterDataset(ds, Halves()),
    lambda ds: ds.filter(lambda e: len(e["t"]) != 3),
    lambda ds: ds.repeat(2),
    lambda ds: ds.limit(25),
    lambda ds: ex.RebatchIterDataset(ds.batch(3, padding_struct={"t": 9}), 2).map(
        lambda b: {"t": b["t"][0]}
    ),
    lambda ds: chute.IterDataset.mix([ds, ds.map(lambda e: {"t": e["t"] + 1000})], [2, 1]),
    lambda ds: ex.ZipIterDataset([ds, ds.limit(30)], strict=False).map(lambda ab: ab[0]),
    lambda ds: ds.cache(),
]
_ENDS: list[Callable[[chute.IterDataset[Any]], chute.IterDataset[Any]]] = [
    lambda ds: ds,
    lambda ds: ex.FirstFitPackIterDataset(ds, length_struct={"t": 9}, num_packing_bins=3, seed=2),
    lambda ds: ex.BestFitPackIterDataset(ds, length_struct={"t": 9}, num_packing_bins=2, seed=2),
    lambda ds: ex.ConcatThenSplitIterDataset(ds, length_struct={"t": 5}),
]


def _build(n: int, stages: list[int], end: int, threads: int) -> chute.IterDataset[Any]:
    lengths = [1 + (i * 7) % 9 for i in range(n)]
    seqs = [{"t": np.arange(k) + 10 * i} for i, k in enumerate(lengths)]
    options = chute.ReadOptions(num_threads=threads, prefetch_buffer_size=4)
    files = [
        chute.MapDataset.source(seqs[i::2]).shuffle(seed=i).to_iter_dataset(options)
        for i in range(2)
    ]
    ds: chute.IterDataset[Any] = ex.InterleaveIterDataset(files, cycle_length=2, iter_buffer_size=3)
    for s in stages:
        ds = _STAGES[s](ds)
    return _ENDS[end](ds)


@given(
    n=st.integers(1, 24),
    stages=st.lists(st.integers(0, len(_STAGES) - 1), max_size=3),
    end=st.integers(0, len(_ENDS) - 1),
    threads=st.sampled_from([1, 3]),
)
@settings(max_examples=40, deadline=None)
def test_any_chain_restores_exactly_and_ignores_threads(
    n: int, stages: list[int], end: int, threads: int
) -> None:
    reference = list(_build(n, stages, end, 0))
    assert_trees_equal(list(_build(n, stages, end, threads)), reference)
    assert_equal_output_after_checkpoint(
        _build(n, stages, end, 0), restore_into=_build(n, stages, end, threads), max_elements=40
    )
