"""Counter-based randomness: every random choice is a pure function of (seed, epoch, index).

Seeds are mixed with SplitMix64's finaliser, a bijection on 64-bit integers whose output
bits each depend on every input bit. `derive_seed(seed, a, b, ...)` folds further keys in
one at a time, so derive_seed(5, epoch=1) and derive_seed(6, epoch=0) are unrelated, unlike
`seed + epoch`.

States, errors and reprs show a random stage's seed as the user gave it, with the seed
derived from it beside it (`seed=42 (derived 17532488217563185893)`, or
`seed=ds.seed(42) (derived ...)` for a stage that takes the pipeline seed); the derived
seed alone fixes the order. `same_params` also accepts the derived seed alone
(`seed=17532488217563185893`), as states saved before this was shown recorded it.
"""

from __future__ import annotations

import operator
import re
from typing import Any

import numpy as np

MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def mix64(x: int) -> int:
    """SplitMix64's finaliser on a Python int (taken modulo 2**64)."""
    x = (x + _GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * _M1) & MASK64
    x = ((x ^ (x >> 27)) * _M2) & MASK64
    return x ^ (x >> 31)


def derive_seed(seed: int, *keys: int) -> int:
    """A 64-bit seed derived from `seed` and the integer `keys`, order-sensitive."""
    h = mix64(seed)
    for k in keys:
        h = mix64(h ^ (k & MASK64))
    return h


def mix64_array(x: np.ndarray) -> np.ndarray:
    """`mix64` applied element-wise to a uint64 array (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(_GOLDEN)
        x ^= x >> np.uint64(30)
        x *= np.uint64(_M1)
        x ^= x >> np.uint64(27)
        x *= np.uint64(_M2)
        x ^= x >> np.uint64(31)
    return x


def validate_seed(seed: Any, where: str, bits: int = 64) -> int:
    """Returns `seed` as an int, or raises naming `where`, the rule and the fix.

    `bits=32` where Grain takes only 32-bit seeds (`shuffle(seed)`, `IndexSampler`);
    seeds chute derives itself are 64-bit and never pass through here."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(
            f"{where}: seed={seed!r} of type {type(seed).__name__} is invalid: a seed must be "
            "an int; pass an integer such as seed=42."
        )
    seed = operator.index(seed)
    if seed < 0 or seed >= 1 << bits:
        raise ValueError(
            f"{where}: seed={seed} is out of range: a seed must be in [0, 2**{bits}); "
            "pass a non-negative integer such as seed=42."
        )
    return seed


def shown_seed(seed: Any, pipeline_seed: int | None) -> str:
    """A random stage's seed as the user gave it: `seed` (already validated) if given,
    else the pipeline seed it derives its own from, as `ds.seed(N)`."""
    if seed is not None:
        return str(operator.index(seed))
    return f"ds.seed({pipeline_seed})"


def seed_param(shown: str, derived: int) -> str:
    """`seed=...` as a stage's state and identity record it: the seed the user gave
    (`shown_seed`) and, beside it, the derived seed that fixes the order."""
    return f"seed={shown} (derived {derived})"


_SHOWN = re.compile(r"seed=(?:\d+|ds\.seed\(\d+\)) \(derived (\d+)\)")


def legacy_params(text: str) -> str:
    """`text` (a stage's params, or an entry of a pipeline's identity) as states saved
    before seeds were shown as given record it: the derived seed alone (`seed=N`)."""
    return _SHOWN.sub(r"seed=\1", text)


def same_params(recorded: Any, now: str) -> bool:
    """True if `recorded` (from a state) names the same stage parameters as `now`: equal,
    or equal to `now` in the form older states have (`legacy_params`).

    >>> now = seed_param("42", 17532488217563185893)
    >>> now
    'seed=42 (derived 17532488217563185893)'
    >>> same_params(now, now), same_params("seed=17532488217563185893", now)
    (True, True)
    >>> same_params("seed=42", now), same_params("seed=1 (derived 17532488217563185893)", now)
    (False, False)
    """
    return recorded == now or (isinstance(recorded, str) and recorded == legacy_params(now))
