"""Applying a user function over a block at comprehension speed, naming a failing element.

A comprehension is ~30% faster than an explicit loop with `append`, but loses the position
of a failing element. Iterating over a list iterator keeps it: after an exception, the
iterator's length hint says how many elements were not consumed, so the failing element is
the one just before them. Nothing is recomputed.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any


def failed_position(it: Iterator[Any], total: int) -> int:
    """The position of the element being processed when iteration over `it` raised."""
    return max(0, total - operator.length_hint(it) - 1)
