"""`get_next_index`/`set_next_index` through `batch` (the index counts batches) and
`limit`, as in Grain."""

import numpy as np
import pytest

import chute
from chute.experimental import get_next_index, set_next_index


@pytest.mark.parametrize(
    ("batch_size", "drop_remainder", "expected"),
    [
        (2, False, [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]),
        (3, False, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]),
        (3, True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
    ],
)
def test_batch(batch_size: int, drop_remainder: bool, expected: list[list[int]]) -> None:
    rows = chute.MapDataset.range(10).to_iter_dataset().map(lambda x: x)
    ds = rows.batch(batch_size, drop_remainder=drop_remainder)
    it = iter(ds)
    assert get_next_index(it) == 0
    for i, _ in enumerate(it):
        assert get_next_index(it) == i + 1
    for i in reversed(range(len(expected))):
        it = iter(ds)
        set_next_index(it, i)
        assert get_next_index(it) == i
        np.testing.assert_array_equal(next(it), expected[i])


def test_limit() -> None:
    ds = chute.MapDataset.range(20).batch(3).to_iter_dataset().limit(2)
    it = iter(ds)
    assert get_next_index(it) == 0
    next(it)
    assert get_next_index(it) == 1
    next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert get_next_index(it) == 2
    it = iter(ds)
    set_next_index(it, 1)
    assert get_next_index(it) == 1
    np.testing.assert_array_equal(next(it), [3, 4, 5])
    assert get_next_index(it) == 2
    with pytest.raises(StopIteration):
        next(it)


def test_batch_after_a_filter_still_raises() -> None:
    ds = chute.MapDataset.range(10).to_iter_dataset().filter(lambda x: x % 2).batch(2)
    with pytest.raises(ValueError, match="stage 'filter'"):
        get_next_index(iter(ds))


def test_no_next_index_is_grains_not_implemented_error() -> None:
    ds = chute.MapDataset.range(10).to_iter_dataset().filter(lambda x: x % 2)
    it = iter(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=1)))
    next(it)
    with pytest.raises(NotImplementedError, match="stage 'filter'"):
        chute.experimental.set_next_index(it, 3)
    it.close()
    filtered = chute.MapDataset.range(10).filter(lambda x: x % 2).to_iter_dataset()
    it = iter(filtered.map_with_index(lambda i, x: x))
    next(it)
    with pytest.raises(NotImplementedError, match="cannot be moved without reading"):
        chute.experimental.set_next_index(it, 5)
