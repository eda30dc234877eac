"""Iterator state: small JSON dicts shaped like the pipeline, exact restore, clear rejection."""

from __future__ import annotations

import json

import numpy as np
import pytest

import chute
from chute.testing import assert_equal_output_after_checkpoint


def pipeline(threads: int = 0, seed: int = 1) -> chute.IterDataset[np.ndarray]:
    return (
        chute.MapDataset.range(1000)
        .shuffle(seed=seed)
        .map(lambda x: x * 2)
        .repeat(3)[1::2]
        .to_iter_dataset(chute.ReadOptions(num_threads=threads))
        .filter(lambda x: x % 3 != 0)
        .batch(16)
    )


def test_state_is_small_json_shaped_like_the_pipeline() -> None:
    it = iter(pipeline())
    for _ in range(5):
        next(it)
    state = it.get_state()
    assert json.loads(json.dumps(state)) == state
    assert len(json.dumps(state)) < 370  # 342: a seed shown as given and derived, a checksum
    assert state["stage"] == "batch"
    assert state["parent"]["stage"] == "filter"
    assert state["parent"]["parent"]["stage"] == "to_iter_dataset"


def test_restore_mid_stream_across_epochs_and_thread_counts() -> None:
    it = iter(pipeline())
    for _ in range(40):  # past the first epoch boundary (1,000 positions per epoch)
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = [next(it).tolist() for _ in range(10)]
    for threads in (0, 1, 3):
        fresh = iter(pipeline(threads))
        fresh.set_state(state)
        assert [next(fresh).tolist() for _ in range(10)] == expected
        fresh.close()


def test_checkpoint_helper_over_the_whole_stream() -> None:
    small = (
        chute.MapDataset.range(37)
        .shuffle(seed=4)
        .repeat(2)
        .to_iter_dataset(chute.ReadOptions(num_threads=2, prefetch_buffer_size=5))
        .batch(5)
    )
    assert_equal_output_after_checkpoint(small)


def test_state_from_a_different_pipeline_is_rejected() -> None:
    state = iter(pipeline(seed=1)).get_state()
    with pytest.raises(chute.CheckpointError, match=r"different MapDataset.*rebuild the pipeline"):
        iter(pipeline(seed=2)).set_state(state)
    other_shape = iter(chute.MapDataset.range(1000).to_iter_dataset()).get_state()
    with pytest.raises(
        chute.CheckpointError, match=r"'to_iter_dataset' stage, but this pipeline has a 'batch'"
    ):
        iter(pipeline()).set_state(other_shape)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s["parent"]["parent"].update(next_index=-4), r"next_index.*must be an int"),
        (lambda s: s["parent"]["parent"].update(next_index="7"), r"next_index.*must be an int"),
        (lambda s: s["parent"]["parent"].update(next_index=10**9), r"next_index.*\[0, 1500\]"),
        (lambda s: s["parent"].pop("parent"), r"has keys \['stage'\], expected"),
        (lambda s: s.update(extra=1), r"has keys .*'extra'.*corrupt"),
        (lambda s: s["parent"].update(parent=[1]), r"is a list, not a dict"),
    ],
)
def test_corrupted_state_is_rejected(mutate: object, message: str) -> None:
    state = iter(pipeline()).get_state()
    mutate(state)  # type: ignore[operator]
    with pytest.raises(chute.CheckpointError, match="changed after it was saved"):
        iter(pipeline()).set_state(state)  # its checksum catches any edit
    del state["checksum"]  # unchecked, as a state edited on purpose: its values are checked
    with pytest.raises(chute.CheckpointError, match=message):
        iter(pipeline()).set_state(state)


def test_restoring_at_the_end_gives_nothing_more() -> None:
    ds = chute.MapDataset.range(5).to_iter_dataset()
    it = iter(ds)
    assert list(it) == [0, 1, 2, 3, 4]
    fresh = iter(ds)
    fresh.set_state(it.get_state())
    assert list(fresh) == []
