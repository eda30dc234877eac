"""Module-level transforms for the stream-operation tests (picklable for worker processes)."""

from __future__ import annotations

from chute.experimental import FlatMapTransform


class Upto(FlatMapTransform):
    """x -> [x*10, x*10+1, ...], x % 4 parts (some elements vanish)."""

    max_fan_out = 3

    def flat_map(self, element: int) -> list[int]:
        return [element * 10 + j for j in range(element % 4)]


class First(FlatMapTransform):
    """A pair (a, b) -> [a, b] when a is even, else [a]."""

    max_fan_out = 2

    def flat_map(self, element: tuple[int, int]) -> list[int]:
        a, b = element
        return [a, b] if a % 2 == 0 else [a]
