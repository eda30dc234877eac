"""`RangeDataSource`: the integers of a range, as a data source."""

from __future__ import annotations

from collections.abc import Sequence


class RangeDataSource:
    """The integers `range(start, stop, step)` as a random-access data source.

    >>> src = RangeDataSource(0, 10, 3)
    >>> len(src), src[1], src[-1]
    (4, 3, 9)
    """

    def __init__(self, start: int, stop: int, step: int = 1) -> None:
        if step == 0:
            raise ValueError(
                "RangeDataSource step=0 is invalid: step must be non-zero; "
                "use step=1 for consecutive integers."
            )
        self._range = range(start, stop, step)

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: int) -> int:
        return self._range[index]

    def __getitems__(self, indices: Sequence[int]) -> list[int]:
        r = self._range
        return [r.start + i * r.step for i in indices]

    def __repr__(self) -> str:
        r = self._range
        return f"RangeDataSource(start={r.start}, stop={r.stop}, step={r.step})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeDataSource) and self._range == other._range

    def __hash__(self) -> int:
        return hash(self._range)
