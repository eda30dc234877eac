"""The protocol every random-access data source follows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class RandomAccessDataSource(Protocol[T_co]):
    """A finite, random-access collection of records.

    `__len__` and `__getitem__(int)` are required; any `collections.abc.Sequence` is one.
    A source may also offer `__getitems__(indices) -> list`, a batched read that chute
    calls with a whole block of indices at once (indices are always in `[0, len)`), which
    lets a reader amortise its per-call cost. Sources handed to worker processes must be
    picklable; sources holding open files should reopen them lazily after unpickling.
    A latency-bound source (remote reads) may declare `reads_in_flight: int`, the elements
    a reader should compute ahead from the start (`_src/core/in_flight.py`).
    """

    def __len__(self) -> int: ...

    def __getitem__(self, index: int, /) -> T_co: ...


def getitems(source: Any, indices: Sequence[int]) -> list[Any]:
    """Reads `indices` from `source`, through `__getitems__` when the source has it."""
    batched = getattr(source, "__getitems__", None)
    if batched is not None:
        return list(batched(indices))
    return [source[i] for i in indices]
