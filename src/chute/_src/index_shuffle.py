"""A keyed bijection over `[0, n)`, evaluated for a whole block of indices with numpy.

This is how `shuffle` permutes a dataset in O(1) memory: position `i` of an epoch reads
element `permute(i)`, and nothing is ever materialised. The permutation is a balanced
Feistel network over `2k` bits (the smallest even width with `2**(2k) >= n`, so the domain
is less than `4n`), made a permutation of `[0, n)` by cycle walking: an index that lands
outside the range is permuted again until it lands inside. Cycle walking preserves the
bijection, and because the domain is under `4n` the expected number of walks is small.
"""

from __future__ import annotations

import numpy as np

from chute._src.seeding import derive_seed

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


class IndexShuffle:
    """A permutation of `range(n)` keyed by a 64-bit seed.

    >>> p = IndexShuffle(10, seed=1)
    >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
    True
    """

    __slots__ = ("_half_bits", "_keys", "_mask", "n")

    def __init__(self, n: int, seed: int) -> None:
        if n < 0:
            raise ValueError(f"IndexShuffle n={n} is invalid: n must be >= 0.")
        self.n = n
        bits = max(2, (max(n - 1, 1)).bit_length())
        bits += bits & 1
        self._half_bits = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        self._keys = [np.uint64(derive_seed(seed, r)) for r in range(_ROUNDS)]

    def _round_trip(self, x: np.ndarray) -> np.ndarray:
        hb, mask = self._half_bits, self._mask
        left = x >> hb
        right = x & mask
        with np.errstate(over="ignore"):
            for key in self._keys:
                f = right ^ key
                f *= _M1
                f ^= f >> np.uint64(31)
                f *= _M2
                f ^= f >> np.uint64(29)
                left, right = right, (left ^ f) & mask
        return (left << hb) | right

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """Permuted positions for `indices`, all of which must lie in `[0, n)`."""
        n = self.n
        if n <= 1:
            return np.asarray(indices, dtype=np.int64).copy()
        x = self._round_trip(np.asarray(indices, dtype=np.uint64))
        outside = np.flatnonzero(x >= np.uint64(n))
        while outside.size:
            y = self._round_trip(x[outside])
            x[outside] = y
            outside = outside[y >= np.uint64(n)]
        return x.astype(np.int64)
