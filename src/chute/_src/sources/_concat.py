"""Global record index -> (file number, index in file) over concatenated files."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["Concat"]


class Concat:
    """Maps a global index to `(file, local index)` given each file's record count.

    >>> c = Concat([3, 0, 2])
    >>> len(c), c.locate(0), c.locate(3), c.locate(-1)
    (5, (0, 0), (2, 0), (2, 1))
    """

    def __init__(self, counts: Sequence[int]) -> None:
        self.starts: list[int] = []
        total = 0
        for n in counts:
            self.starts.append(total)
            total += n
        self.counts = list(counts)
        self.total = total

    def __len__(self) -> int:
        return self.total

    def locate(self, index: int, who: object = "source") -> tuple[int, int]:
        n = self.total
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} is out of range for {who} of length {n}")
        k = bisect.bisect_right(self.starts, index) - 1
        return k, index - self.starts[k]
