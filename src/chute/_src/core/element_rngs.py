"""`ElementRngs`: the generator handed to a `random_map` function, keyed by (op seed,
element index) through `seeding`'s mixing.

`import numpy` leaves out numpy.random (~20 ms to import). This module imports it, and so
do the stages that use it (`random_map`, the DataLoader's samplers) by importing this one:
the forkserver, which imports the modules a pipeline's pickle names, then loads it once
for every worker, instead of each worker at its first element.
"""

from __future__ import annotations

import numpy as np
import numpy.random

from chute._src.core.seeding import mix64_array


class ElementRngs:
    """Hands out an `np.random.Generator` keyed by (op seed, element index).

    Constructing a Philox generator costs ~12 us; resetting the key of an existing one
    costs ~1 us, so one instance is made per block of elements and re-keyed per element.
    The generator handed to a user function is valid for that call only: it is re-keyed
    for the next element. Not thread-safe: make one per block/thread.
    """

    __slots__ = ("_bitgen", "_gen", "_key", "_seed", "_state")

    def __init__(self, op_seed: int) -> None:
        self._seed = op_seed
        self._bitgen = np.random.Philox(key=op_seed)
        self._gen = np.random.Generator(self._bitgen)
        self._state = self._bitgen.state
        self._key = np.zeros(2, dtype=np.uint64)
        self._key[1] = op_seed

    def for_indices(self, indices: np.ndarray) -> np.ndarray:
        """Per-element 64-bit keys for a block of element indices."""
        return mix64_array(indices.astype(np.uint64) ^ np.uint64(self._seed))

    def rng(self, element_key: int) -> np.random.Generator:
        """The generator for one element, given its key from `for_indices`."""
        key = np.array([element_key, self._seed], dtype=np.uint64)
        return self._reset(np.zeros(4, dtype=np.uint64), key)

    def _reset(self, counter: np.ndarray, key: np.ndarray) -> np.random.Generator:
        """The generator with its Philox state set to (`counter`, `key`), nothing buffered."""
        state = self._state
        state["state"] = {"counter": counter, "key": key}
        state["buffer_pos"] = 4
        state["has_uint32"] = 0
        self._bitgen.state = state
        return self._gen


class IndexRngs(ElementRngs):
    """Grain's generators for `random_map`: a Philox generator seeded with `seed` (numpy's
    seeding of it), its counter set to `(0, 0, 0, index)` for the element at `index`, so
    the draws are Grain's for the same seed and index.

    Same interface as `ElementRngs` (keys are the indices themselves); the generator is
    valid for one call only. Not thread-safe: make one per block/thread.
    """

    __slots__ = ()

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._bitgen = np.random.Philox(seed)
        self._gen = np.random.Generator(self._bitgen)
        self._state = self._bitgen.state
        self._key = self._state["state"]["key"]

    def for_indices(self, indices: np.ndarray) -> np.ndarray:
        return indices

    def rng(self, element_key: int) -> np.random.Generator:
        return self._reset(np.array([0, 0, 0, element_key], dtype=np.uint64), self._key)
