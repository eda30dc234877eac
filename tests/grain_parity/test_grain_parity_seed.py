"""Under a mix, the pipeline seed comes from every seeded parent, as in Grain: seeding
one parent or all of them gives different random maps above."""

import numpy as np

import chute


class AddRandom(chute.RandomMapTransform):
    def random_map(self, element: int, rng: np.random.Generator) -> int:
        return element + int(rng.integers(0, 1_000_000))


def _mixed(seeded: int) -> list[int]:
    parents = [chute.MapDataset.range(15) for _ in range(7)]
    parents[:seeded] = [p.seed(128) for p in parents[:seeded]]
    return list(chute.MapDataset.mix(parents).random_map(AddRandom()))


def test_every_parent_seed_counts() -> None:
    assert _mixed(1) == _mixed(1)
    assert _mixed(7) == _mixed(7)
    assert _mixed(1) != _mixed(7)
    assert _mixed(2) != _mixed(1)
