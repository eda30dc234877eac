"""`MapDataset._getitems` takes any sequence of indices (a list, a range), as Grain's
does; chute's stages receive an int64 array."""

import numpy as np

import chute


def test_getitems_takes_a_list_or_a_range() -> None:
    ds = chute.MapDataset.range(3).repeat(3)
    assert list(ds._getitems([0, 1, 2, 3, 4])) == [0, 1, 2, 0, 1]  # type: ignore[arg-type]
    mapped = chute.MapDataset.range(10).map(lambda x: x * 2).filter(lambda x: x % 3 != 0)
    assert list(mapped._getitems(range(4))) == [None, 2, 4, None]  # type: ignore[arg-type]
    assert list(mapped._getitems(np.arange(2, 4))) == [4, None]


def test_a_subclass_getitems_receives_an_array() -> None:
    seen = []

    class Doubled(chute.MapDataset):
        def __init__(self, parent):
            super().__init__(parent)
            self._inner = parent

        def __len__(self):
            return len(self._inner)

        def _getitems(self, indices):
            seen.append(type(indices))
            return [2 * x for x in self._inner._getitems(indices)]

    ds = Doubled(chute.MapDataset.range(5))
    assert ds._getitems([1, 4]) == [2, 8]
    assert seen == [np.ndarray]
    assert list(ds) == [0, 2, 4, 6, 8]
