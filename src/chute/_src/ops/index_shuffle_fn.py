"""`experimental.index_shuffle`: one position of a keyed permutation of `[0, max_index]`."""

from __future__ import annotations

import functools

import numpy as np

from chute._src.core.seeding import derive_seed
from chute._src.ops.index_shuffle import IndexShuffle


@functools.lru_cache(maxsize=16)
def _permutation(n: int, seed: int, rounds: int) -> IndexShuffle:
    return IndexShuffle(n, derive_seed(seed, rounds))


def index_shuffle(index: int, max_index: int, seed: int, rounds: int) -> int:
    """Where `index` goes in a permutation of `0..max_index` keyed by `seed` and `rounds`:
    `shuffle`'s permutation (not Grain's: the same arguments give other positions).

    >>> sorted(index_shuffle(i, max_index=9, seed=5, rounds=4) for i in range(10))
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    """
    if not 0 <= index <= max_index:
        raise ValueError(
            f"index_shuffle: index={index} is out of [0, max_index={max_index}]: index must be "
            "in [0, max_index]; pass an index in that range."
        )
    if isinstance(rounds, bool) or not isinstance(rounds, int | np.integer):
        raise ValueError(
            f"index_shuffle: rounds={rounds!r} is invalid: rounds must be an even integer "
            "between 4 and 1024, as in Grain (e.g. rounds=4)."
        )
    if rounds % 2 or not 4 <= rounds <= 1024:
        raise ValueError(
            f"index_shuffle: rounds={rounds} is invalid: rounds must be an even integer "
            "between 4 and 1024, as in Grain (e.g. rounds=4)."
        )
    permutation = _permutation(max_index + 1, int(seed) & (2**64 - 1), int(rounds))
    return int(permutation(np.array([index], dtype=np.int64))[0])
