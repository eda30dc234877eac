"""`DatasetSelectionMap`: which dataset, and which of its elements, each position reads."""

from __future__ import annotations

import abc


class DatasetSelectionMap(abc.ABC):
    """Maps position `k` to `(dataset index, index within that dataset)`, for
    `MapDataset.select_from_datasets`. Stateless and picklable: it is called in every worker.

    >>> import chute
    >>> class Alternate(DatasetSelectionMap):
    ...     def __len__(self):
    ...         return 4
    ...     def __getitem__(self, index):
    ...         return index % 2, index // 2
    >>> a, b = chute.MapDataset.range(2), chute.MapDataset.range(10, 12)
    >>> list(chute.MapDataset.select_from_datasets([a, b], Alternate()))
    [0, 10, 1, 11]
    """

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of positions."""

    @abc.abstractmethod
    def __getitem__(self, index: int) -> tuple[int, int]:
        """`(dataset index, index within that dataset)` of position `index`."""
