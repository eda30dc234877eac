"""A FlatMap that does not set `max_fan_out` works on a stream (and resumes from its
states), as Grain's `FlatMapIterDataset` does; the MapDataset form still needs it."""

from typing import Any

import pytest

import chute
from chute.experimental import FlatMapIterDataset, FlatMapMapDataset, FlatMapTransform


class Unbatch(FlatMapTransform):
    def flat_map(self, elements: Any) -> list[Any]:
        return list(elements)


def test_stream_without_max_fan_out() -> None:
    data = [[1, 2], [3], [], [4, 5, 6]]
    ds = FlatMapIterDataset(chute.MapDataset.source(data).to_iter_dataset(), Unbatch())
    assert list(ds) == [1, 2, 3, 4, 5, 6]
    it = iter(ds)
    states, seen = [], []
    for _ in range(6):
        states.append(it.get_state())
        seen.append(next(it))
    for k, state in enumerate(states):
        again = iter(ds)
        again.set_state(state)
        assert list(again) == seen[k:]


def test_map_dataset_needs_max_fan_out() -> None:
    with pytest.raises(ValueError, match="max_fan_out = None is invalid"):
        FlatMapMapDataset(chute.MapDataset.source([[1]]), Unbatch())
