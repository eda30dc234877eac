"""A state does not depend on how the pipeline runs, and records what fixes positions.

Portability: a state taken with any number of worker processes (or no `mp_prefetch`
stage at all), threads or prefetching restores into the same pipeline run any other way,
in the Dataset API and the DataLoader API, and continues element for element.

Identity: a state restores only into a pipeline whose sources, seeds, slicing, repeats,
batch sizes and stage order are those it was taken from; the error names the first
difference. The map and filter functions are not part of it: fixing one mid-run resumes.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import chute
from chute.testing import assert_equal_output_after_checkpoint
from mp_pipelines import double, jitter, keep

STEPS = [0, 1, 7, 23]  # batches taken before the state

# How a pipeline runs: worker processes (None: no mp_prefetch stage), reader threads, and
# whether a ThreadPrefetchIterDataset sits on top.
Run = tuple[int | None, int, bool]


def plus_one(x: int) -> int:
    return x + 1


def pipeline(run: Run) -> chute.IterDataset[Any]:
    """120 elements, 80 after the filter, 27 batches: shuffled, random, filtered and batched
    after to_iter_dataset (the filter and map are moved into the workers)."""
    workers, threads, thread_prefetch = run
    ds: chute.IterDataset[Any] = (
        chute.MapDataset.range(120)
        .seed(7)
        .shuffle()
        .map(double)
        .random_map(jitter)
        .to_iter_dataset(chute.ReadOptions(num_threads=threads, prefetch_buffer_size=5))
        .filter(keep)
        .map(plus_one)
        .batch(3)
    )
    if workers is not None:
        ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    if thread_prefetch:
        ds = chute.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=4)
    return ds


@pytest.mark.parametrize(
    ("taken", "restored"),
    [
        ((None, 0, False), (1, 0, False)),  # no mp_prefetch stage -> 1 worker
        ((1, 0, False), (None, 0, False)),
        ((0, 0, False), (2, 0, False)),  # the stage with 0 workers -> 2
        ((2, 0, False), (0, 0, False)),
        ((None, 0, False), (2, 0, True)),
        ((2, 0, True), (None, 0, False)),
        ((2, 0, False), (3, 0, False)),
        ((4, 0, False), (None, 0, False)),
        ((None, 0, False), (None, 2, True)),  # threads 0 -> 2, with ThreadPrefetch
        ((None, 2, True), (None, 0, False)),
        ((1, 2, False), (None, 0, True)),
    ],
    ids=str,
)
def test_a_dataset_state_restores_however_the_pipeline_runs(taken: Run, restored: Run) -> None:
    assert_equal_output_after_checkpoint(
        pipeline(taken), restore_into=pipeline(restored), max_elements=30, steps=STEPS
    )


def test_the_state_is_the_same_however_the_pipeline_runs() -> None:
    states = []
    for run in [(None, 0, False), (2, 0, True), (0, 3, False)]:
        it = iter(pipeline(run))
        for _ in range(5):
            next(it)
        states.append(json.loads(json.dumps(it.get_state())))
        it.close()
    assert states[0] == states[1] == states[2]
    assert states[0]["stage"] == "batch"  # no trace of mp_prefetch or thread_prefetch


class Scale(chute.MapTransform):
    def map(self, element: np.ndarray) -> np.ndarray:
        return element * 10


class Jitter(chute.RandomMapTransform):
    def random_map(self, element: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return element + rng.integers(0, 5)


class KeepSome(chute.FilterTransform):
    def filter(self, element: np.ndarray) -> bool:
        return bool(element[0] % 4 != 1)


def loader(
    workers: int, threads: int = 0, *, filtered: bool = True, batch_size: int = 3
) -> chute.DataLoader:
    """100 records, two epochs; batched after a filter (while iterating) or, unfiltered,
    on the MapDataset."""
    operations: list[Any] = [Scale(), Jitter()]
    if filtered:
        operations.append(KeepSome())
    operations.append(chute.Batch(batch_size))
    return chute.DataLoader(
        data_source=[np.array([i, -i], dtype=np.int64) for i in range(100)],
        sampler=chute.IndexSampler(100, shuffle=True, seed=3, num_epochs=2),
        operations=operations,
        worker_count=workers,
        num_threads=threads,
    )


@pytest.mark.parametrize(
    ("taken", "restored"),
    [((2, 0), (0, 0)), ((0, 0), (2, 0)), ((0, 0), (1, 2)), ((1, 2), (0, 0)), ((2, 0), (3, 0))],
    ids=str,
)
def test_a_loader_state_restores_with_any_worker_and_thread_count(
    taken: tuple[int, int], restored: tuple[int, int]
) -> None:
    assert_equal_output_after_checkpoint(
        loader(*taken), restore_into=loader(*restored), max_elements=30, steps=STEPS
    )


def test_a_loader_state_from_four_workers_restores_without_workers() -> None:
    assert_equal_output_after_checkpoint(
        loader(4, filtered=False),
        restore_into=loader(0, filtered=False),
        max_elements=30,
        steps=STEPS,
    )


def test_a_loader_state_is_its_datasets_and_restores_under_thread_prefetch() -> None:
    prefetched = chute.experimental.ThreadPrefetchIterDataset(
        loader(0).dataset, prefetch_buffer_size=3
    )
    assert_equal_output_after_checkpoint(
        loader(2), restore_into=prefetched, max_elements=30, steps=STEPS
    )
    assert_equal_output_after_checkpoint(
        prefetched, restore_into=loader(0), max_elements=30, steps=STEPS
    )


# -- identity --------------------------------------------------------------------------------


def _state_after(ds: Any, n: int) -> dict[str, Any]:
    it = iter(ds)
    for _ in range(n):
        next(it)
    state: dict[str, Any] = json.loads(json.dumps(it.get_state()))
    return state


def test_the_state_names_what_fixes_positions() -> None:
    ds = chute.MapDataset.range(10).seed(1).shuffle()[2:9].repeat(2).batch(2).to_iter_dataset()
    state = _state_after(ds, 1)
    assert state["stage"] == "to_iter_dataset"
    assert state["next_index"] == 1
    pipeline = state["pipeline"]
    assert pipeline[0] == "Range(start=0, stop=10, step=1)"
    assert pipeline[1].startswith("Shuffle(seed=")
    assert pipeline[2:] == [
        "Slice(2:9:1)",
        "Repeat(num_epochs=2)",
        "Batch(batch_size=2, drop_remainder=False)",
    ]


def _base(
    n: int = 40, seed: int = 1, start: int = 0, epochs: int = 2, size: int = 4
) -> chute.IterDataset[Any]:
    return (
        chute.MapDataset.range(n)
        .shuffle(seed=seed)[start:]
        .repeat(epochs)
        .map(plus_one)
        .to_iter_dataset()
        .batch(size)
    )


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (
            _base(seed=2),
            r"state\['parent'\]\['pipeline'\]\[1\] = 'Shuffle\(seed=1 \(derived \d+\)\)' in the "
            r"state, but this pipeline has 'Shuffle\(seed=2 \(derived \d+\)\)' there",
        ),
        (_base(n=41), r"\['pipeline'\]\[0\] = 'Range\(start=0, stop=40, step=1\)' in the state"),
        (_base(start=1), r"\['pipeline'\]\[2\] = 'Slice\(0:40:1\)' in the state, but .*1:40:1"),
        (_base(epochs=3), r"'Repeat\(num_epochs=2\)' in the state, but .*'Repeat\(num_epochs=3\)"),
        (
            _base(size=5),
            r"state\['params'\] = 'batch_size=4, drop_remainder=False', but this pipeline's "
            r"'batch' stage there has 'batch_size=5, drop_remainder=False'",
        ),
        (  # the same stages in another order
            chute.MapDataset.range(40)
            .repeat(2)
            .shuffle(seed=1)
            .map(plus_one)
            .to_iter_dataset()
            .batch(4),
            r"\['pipeline'\]\[1\] = 'Shuffle\(seed=1 \(derived \d+\)\)' in the state, but this "
            r"pipeline has 'Repeat\(num_epochs=2\)' there",
        ),
        (  # a stage more
            chute.MapDataset.range(40)
            .shuffle(seed=1)[0:]
            .repeat(2)
            .map(plus_one)
            .batch(1)
            .to_iter_dataset()
            .batch(4),
            r"this pipeline has 'Batch\(batch_size=1, drop_remainder=False\)' at \[5\]: the "
            r"state was taken from a pipeline with fewer stages",
        ),
    ],
    ids=["seed", "length", "slice", "repeat", "batch_size", "order", "extra_stage"],
)
def test_a_state_of_another_pipeline_is_rejected_naming_the_difference(
    other: chute.IterDataset[Any], match: str
) -> None:
    state = _state_after(_base(), 3)
    expected = [b.tolist() for b in other][1:3]
    it = iter(other)
    next(it)
    with pytest.raises(chute.CheckpointError, match=match) as e:
        it.set_state(state)
    assert "rebuild the pipeline as it was when the state was taken" in str(e.value)
    assert [next(it).tolist(), next(it).tolist()] == expected  # where it was


def test_a_loader_state_with_another_batch_size_or_seed_is_rejected() -> None:
    state = _state_after(loader(0, filtered=False), 2)
    with pytest.raises(chute.CheckpointError, match=r"'Batch\(batch_size=3.*'Batch\(batch_size=4"):
        iter(loader(0, filtered=False, batch_size=4)).set_state(state)
    state = _state_after(loader(0), 2)
    with pytest.raises(chute.CheckpointError, match=r"batch_size=3.*batch_size=5"):
        iter(loader(0, batch_size=5)).set_state(state)
    other_seed = chute.DataLoader(
        data_source=[np.array([i, -i], dtype=np.int64) for i in range(100)],
        sampler=chute.IndexSampler(100, shuffle=True, seed=4, num_epochs=2),
        operations=[Scale(), Jitter(), KeepSome(), chute.Batch(3)],
    )
    with pytest.raises(
        chute.CheckpointError, match=r"Shuffle\(seed=3 \(derived \d+\)\)' in the state"
    ):
        iter(other_seed).set_state(state)


def test_a_changed_map_or_filter_function_restores() -> None:
    """Teams fix a preprocessing bug mid-run and resume: the functions are not identity."""

    def build(fn: Any, keep_fn: Any) -> chute.IterDataset[Any]:
        return (
            chute.MapDataset.range(30)
            .shuffle(seed=5)
            .map(fn)
            .filter(keep_fn)
            .to_iter_dataset()
            .map(fn)
            .batch(2)
        )

    old = build(lambda x: x + 1, lambda x: x >= 0)
    state = _state_after(old, 4)

    def fixed(x: int) -> int:  # another name, another body
        return x * 100

    new = build(fixed, lambda x: x > -1)
    it = iter(new)
    it.set_state(state)
    rest = [b.tolist() for b in it]
    expected = [b.tolist() for b in new][4:]
    assert rest == expected and len(rest) == 11


def test_a_loader_with_a_renamed_transform_restores() -> None:
    class Times10(chute.MapTransform):  # Scale, renamed
        def map(self, element: np.ndarray) -> np.ndarray:
            return element * 10

    state = _state_after(loader(0), 5)
    renamed = chute.DataLoader(
        data_source=[np.array([i, -i], dtype=np.int64) for i in range(100)],
        sampler=chute.IndexSampler(100, shuffle=True, seed=3, num_epochs=2),
        operations=[Times10(), Jitter(), KeepSome(), chute.Batch(3)],
    )
    it = iter(renamed)
    it.set_state(state)
    reference = iter(loader(0))
    reference.set_state(state)
    for a, b in zip(it, reference):
        assert np.array_equal(a, b)
