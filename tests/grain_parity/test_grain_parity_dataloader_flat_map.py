"""The DataLoader takes a FlatMap among its operations, as Grain's does: each element
becomes several; the output resumes exactly from a state, with or without workers."""

from typing import Any

import pytest

import chute


class Duplicate(chute.experimental.FlatMapTransform):
    def __init__(self, fan_out: int | None) -> None:
        self.max_fan_out = fan_out

    def flat_map(self, element: Any) -> Any:  # a generator, as Grain's tests write it
        for _ in range(3):
            yield element


class Even(chute.transforms.Filter):
    def filter(self, element: int) -> bool:
        return element % 2 == 0


def _loader(fan_out: int | None, workers: int = 0, batch: bool = False) -> chute.DataLoader:
    ops: list[Any] = [Even(), Duplicate(fan_out)]
    if batch:
        ops.append(chute.Batch(batch_size=4))
    return chute.DataLoader(
        data_source=chute.sources.RangeDataSource(0, 8, 1),
        sampler=chute.SequentialSampler(8, chute.sharding.NoSharding()),
        operations=ops,
        worker_count=workers,
    )


@pytest.mark.parametrize("fan_out", [3, 7, None])
def test_flat_map_operation(fan_out: int | None) -> None:
    assert list(_loader(fan_out)) == [0, 0, 0, 2, 2, 2, 4, 4, 4, 6, 6, 6]


def test_batches_after_a_flat_map_are_full() -> None:
    got = [b.tolist() for b in _loader(5, batch=True)]
    assert got == [[0, 0, 0, 2], [2, 2, 4, 4], [4, 6, 6, 6]]


@pytest.mark.parametrize("fan_out", [3, None])
def test_resumes_from_state(fan_out: int | None) -> None:
    it = iter(_loader(fan_out))
    head = [next(it) for _ in range(4)]
    state = it.get_state()
    rest = list(it)
    again = iter(_loader(fan_out))
    again.set_state(state)
    assert head + list(again) == head + rest == [0, 0, 0, 2, 2, 2, 4, 4, 4, 6, 6, 6]


def test_with_workers() -> None:
    assert list(_loader(3, workers=2)) == list(_loader(3))
