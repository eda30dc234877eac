"""A keyed bijection over `[0, n)`, evaluated for a whole block of indices with numpy.

This is how `shuffle` permutes a dataset in O(1) memory: position `i` of an epoch reads
element `permute(i)`, and nothing is ever materialised.

The permutation is an alternating (mixed-radix) Feistel network. An index `x < a*b` is
split as `(L, R) = divmod(x, b)` with `a = ceil(sqrt(n))`, `b = ceil(n / a)`, so the domain
`a*b` exceeds `n` by less than `a`. A round maps `(L, R)` in `Z_A x Z_B` to
`(R, (L + F(R)) mod A)` in `Z_B x Z_A`, which is invertible whatever the round function
`F` (a SplitMix64-style mixer keyed per round); after an even number of rounds the pair is
back in `Z_a x Z_b`. `F(R) mod A` is taken as `((F >> 32) * A) >> 32` (Lemire's
multiply-shift reduction, exact for `A < 2**32`, i.e. `n < 2**64`), so no round divides. The few results that land in `[n, a*b)` are permuted again until they
land inside (cycle walking, which keeps the map a bijection): with `a*b - n < sqrt(n) + 1`
that is rare, so a block costs about one pass.

For small `n` (up to `TABLE_MAX`) six rounds over tiny radices are measurably non-uniform,
so the permutation is instead a table: indices sorted by a keyed 64-bit hash (a bijection,
so there are no ties and the order does not depend on numpy's sort algorithm). The table
costs 8 bytes per element, at most 512 KiB.

`index_shuffle(index, max_index, seed, rounds)` (`chute.experimental`, Grain's name) is one
position of the same permutation, for code that permutes its own indices.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from chute._src.core.seeding import derive_seed, mix64_array

_ROUNDS = 6
TABLE_MAX = 1 << 16
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S31, _S29, _S32 = np.uint64(31), np.uint64(29), np.uint64(32)


class IndexShuffle:
    """A permutation of `range(n)` keyed by a 64-bit seed.

    >>> p = IndexShuffle(10, seed=1)
    >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
    True
    """

    __slots__ = ("_a", "_b", "_keys", "_table", "n")

    def __init__(self, n: int, seed: int) -> None:
        if n < 0:
            raise ValueError(f"IndexShuffle n={n} is invalid: n must be >= 0.")
        self.n = n
        a = max(1, math.isqrt(max(n - 1, 0)) + 1)  # ceil(sqrt(n)) for n >= 1
        self._a = np.uint64(a)
        self._b = np.uint64(max(1, -(-n // a)))
        self._keys = [np.uint64(derive_seed(seed, r)) for r in range(_ROUNDS)]
        self._table: np.ndarray | None = None
        if 1 < n <= TABLE_MAX:
            hashed = mix64_array(np.arange(n, dtype=np.uint64) ^ self._keys[0])
            self._table = np.argsort(mix64_array(hashed ^ self._keys[1])).astype(np.int64)

    def _pass(self, x: np.ndarray) -> np.ndarray:
        """One application of the network to uint64 indices in `[0, a*b)`."""
        a, b = self._a, self._b
        left, right = np.divmod(x, b)
        f = np.empty_like(x)
        t = np.empty_like(x)
        with np.errstate(over="ignore"):
            for r, key in enumerate(self._keys):
                mod = a if r % 2 == 0 else b
                np.bitwise_xor(right, key, out=f)
                np.multiply(f, _M1, out=f)
                np.right_shift(f, _S31, out=t)
                np.bitwise_xor(f, t, out=f)
                np.multiply(f, _M2, out=f)
                np.right_shift(f, _S29, out=t)
                np.bitwise_xor(f, t, out=f)
                # F(R) mod `mod` without a division: the high 32 bits times mod, >> 32.
                np.right_shift(f, _S32, out=f)
                np.multiply(f, mod, out=f)
                np.right_shift(f, _S32, out=f)
                # (left + f) mod `mod` for left, f < mod: subtract mod unless that wraps.
                np.add(left, f, out=left)
                np.subtract(left, mod, out=t)
                np.minimum(left, t, out=left)
                left, right = right, left
        np.multiply(left, b, out=left)
        np.add(left, right, out=left)
        return left

    def __call__(self, indices: np.ndarray) -> np.ndarray:
        """Permuted positions for `indices`, all of which must lie in `[0, n)`."""
        n = self.n
        if n <= 1:
            return np.asarray(indices, dtype=np.int64).copy()
        if self._table is not None:
            return self._table[indices]
        x = self._pass(np.asarray(indices, dtype=np.uint64))
        outside = np.flatnonzero(x >= np.uint64(n))
        while outside.size:
            y = self._pass(x[outside])
            x[outside] = y
            outside = outside[y >= np.uint64(n)]
        return x.astype(np.int64)


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
