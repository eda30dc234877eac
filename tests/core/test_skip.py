"""`chute.experimental.skip` / `skip_state`: after skipping `n` steps the stream is the one
that follows `n` steps consumed, and its state restores to it with any number of workers;
index-arithmetic pipelines move without reading a single element."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import chute
from chute.experimental import skip, skip_state
from mp_pipelines import double, keep


def shuffled(workers: int = 0) -> chute.IterDataset[Any]:
    ds = (
        chute.MapDataset.range(300)
        .seed(7)
        .shuffle()
        .repeat(4)
        .map(double)
        .random_map(lambda x, rng: x + int(rng.integers(3)))
        .batch(7)
        .to_iter_dataset()
    )
    if workers:
        ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    return ds


def filtered(workers: int = 0) -> chute.IterDataset[Any]:
    ds = chute.MapDataset.range(300).seed(3).shuffle().to_iter_dataset().filter(keep).batch(5)
    if workers:
        ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    return ds


def steps(it: Any, k: int) -> list[Any]:
    return [np.asarray(next(it)).tolist() for _ in range(k)]


@pytest.mark.parametrize("build", [shuffled, filtered], ids=["index", "filtered"])
@pytest.mark.parametrize("workers", [0, 2])
def test_skip_then_next_is_step_n_of_an_uninterrupted_run(build: Any, workers: int) -> None:
    expected = steps(iter(build(0)), 40)
    for start, n in [(0, 0), (0, 13), (5, 1), (9, 22)]:
        it = iter(build(workers))
        steps(it, start)
        assert skip(it, n) == n
        assert steps(it, 40 - start - n) == expected[start + n :]
        it.close()


@pytest.mark.parametrize("build", [shuffled, filtered], ids=["index", "filtered"])
def test_a_skipped_state_restores_into_any_worker_count(build: Any) -> None:
    expected = steps(iter(build(0)), 30)
    it = iter(build(0))
    steps(it, 4)
    skip(it, 11)
    state = json.loads(json.dumps(it.get_state()))
    for workers in (0, 1, 2):
        again = iter(build(workers))
        again.set_state(state)
        assert steps(again, 15) == expected[15:]
        again.close()


def test_skip_state_moves_a_saved_state_without_the_pipeline_where_positions_are_indices() -> None:
    expected = steps(iter(shuffled()), 30)
    it = iter(shuffled())
    steps(it, 3)
    state = json.loads(json.dumps(it.get_state()))
    moved = skip_state(state, 20)
    assert state == json.loads(json.dumps(it.get_state()))  # the given state is unchanged
    again = iter(shuffled(2))
    again.set_state(moved)
    assert steps(again, 7) == expected[23:]
    again.close()


def test_index_arithmetic_skips_read_nothing() -> None:
    calls = []

    def counted(x: int) -> int:
        calls.append(x)
        return x

    parts = [chute.MapDataset.range(k * 1000, (k + 1) * 1000).seed(k).shuffle() for k in range(3)]
    mixed = chute.MapDataset.mix(parts, [0.5, 0.3, 0.2]).repeat(10**6).map(counted)
    it = iter(mixed.batch(8).to_iter_dataset())
    skip(it, 10**6)
    assert calls == []  # 8e6 elements skipped, none computed
    first = next(it)
    assert 8 <= len(calls) < 1000  # the batch, and what the reader reads ahead of it
    assert first.tolist() == [mixed[10**6 * 8 + j] for j in range(8)]


def test_skip_state_of_a_filtered_stream_needs_the_pipeline_and_names_it() -> None:
    it = iter(filtered())
    steps(it, 2)
    state = it.get_state()
    with pytest.raises(ValueError, match=r"skip_state\(state, n, dataset=ds\)"):
        skip_state(state, 5)
    moved = skip_state(state, 5, dataset=filtered())
    expected = steps(iter(filtered()), 10)
    again = iter(filtered())
    again.set_state(moved)
    assert steps(again, 3) == expected[7:]


def test_skip_works_on_a_dataloader_iterator() -> None:
    def loader(workers: int) -> chute.DataLoader:
        return chute.DataLoader(
            data_source=list(range(200)),
            sampler=chute.IndexSampler(200, shuffle=True, seed=5, num_epochs=2),
            operations=[chute.transforms.Batch(4)],
            worker_count=workers,
        )

    expected = steps(iter(loader(0)), 40)
    for workers in (0, 2):
        it = iter(loader(workers))
        steps(it, 2)
        skip(it, 17)
        assert steps(it, 6) == expected[19:25]
        moved = skip_state(json.loads(json.dumps(it.get_state())), 1)
        again = iter(loader(0))
        again.set_state(moved)
        assert steps(again, 5) == expected[26:31]
        it.close()


def test_a_finite_stream_that_ends_first_says_how_far_it_went() -> None:
    it = iter(filtered())
    total = len(steps(iter(filtered()), 0)) + sum(1 for _ in filtered())
    assert skip(it, total + 5) == total
    with pytest.raises(StopIteration):
        next(it)


def test_bad_input_names_the_rule_and_the_fix() -> None:
    it = iter(shuffled())
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=r"n=.* is invalid: the number of steps to skip"):
            skip(it, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"restore a state saved before it"):
            skip_state(it.get_state(), bad)  # type: ignore[arg-type]
    state = it.get_state()
    tampered = {**state, "next_index": 12}
    with pytest.raises(chute.CheckpointError, match=r"changed after it was saved"):
        skip_state(tampered, 1)
    other = chute.MapDataset.range(301).seed(7).shuffle().to_iter_dataset()
    with pytest.raises(chute.CheckpointError):
        skip_state(filtered().__iter__().get_state(), 1, dataset=other)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_filter_of_the_mapdataset_is_read_not_counted_as_indices(workers: int) -> None:
    """The reader skips the holes a MapDataset filter leaves: a step is then no known
    number of indices, so skip reads (it moved by indices before, landing early)."""

    def build() -> chute.IterDataset[Any]:
        ds = chute.MapDataset.range(200).seed(2).shuffle().filter(keep).to_iter_dataset()
        options = chute.MultiprocessingOptions(num_workers=workers)
        return ds.batch(4).mp_prefetch(options)

    expected = [b.tolist() for b in build()]
    it = iter(build())
    try:
        assert skip(it, 9) == 9
        assert next(it).tolist() == expected[9]
    finally:
        it.close()
    fresh = iter(build())
    start = fresh.get_state()
    fresh.close()
    with pytest.raises(ValueError, match=r"filters elements out.*dataset=ds"):
        skip_state(start, 9)
    it = iter(build())
    try:
        it.set_state(skip_state(start, 9, dataset=build()))
        assert next(it).tolist() == expected[9]
    finally:
        it.close()


@pytest.mark.parametrize("batch", [1, 2])
def test_skip_past_the_end_of_a_finite_stream_stops_there(batch: int) -> None:
    """A move of the index past the end used to make set_state raise CheckpointError."""
    ds = chute.MapDataset.range(5).seed(1).shuffle().batch(batch).to_iter_dataset()
    steps = len(list(ds))
    it = iter(ds)
    next(it)
    assert skip(it, steps + 3) == steps - 1
    with pytest.raises(StopIteration):
        next(it)
    state = skip_state(iter(ds).get_state(), steps + 3, dataset=ds)
    it = iter(ds)
    it.set_state(state)
    assert list(it) == []
