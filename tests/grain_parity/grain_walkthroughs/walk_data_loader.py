"""The DataLoader, as in Grain's DataLoader tutorial: a random-access data source, an
`IndexSampler`, a list of operations (map, random map, filter, batch), worker processes,
and checkpointing the DataLoader's iterator.
"""

import numpy as np

import chute as grain
import chute.python as pygrain


class Squares(pygrain.RandomAccessDataSource):
    """A data source is anything with __len__ and __getitem__."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, record_key: int) -> dict[str, int]:
        return {"key": record_key, "square": record_key * record_key}


class AddOne(pygrain.MapTransform):
    def map(self, element):
        return {**element, "square": element["square"] + 1}


class AddNoise(pygrain.RandomMapTransform):
    def random_map(self, element, rng: np.random.Generator):
        return {**element, "noise": int(rng.integers(0, 1000))}


class DropMultiplesOfThree(pygrain.FilterTransform):
    def filter(self, element) -> bool:
        return element["key"] % 3 != 0


def make_loader(source: Squares, workers: int) -> pygrain.DataLoader:
    sampler = pygrain.IndexSampler(
        num_records=len(source),
        shard_options=pygrain.NoSharding(),
        shuffle=True,
        num_epochs=1,
        seed=42,
    )
    return pygrain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[AddOne(), AddNoise(), DropMultiplesOfThree(), pygrain.Batch(batch_size=4)],
        worker_count=workers,
    )


def main() -> None:
    source = Squares(24)
    kept = [k for k in range(24) if k % 3 != 0]

    loader = make_loader(source, workers=0)
    batches = list(loader)
    keys = sorted(int(k) for b in batches for k in b["key"])
    assert keys == kept
    for b in batches:
        assert b["key"].shape == b["square"].shape == b["noise"].shape
        assert (b["square"] == b["key"] ** 2 + 1).all()
    assert sum(len(b["key"]) for b in batches) == len(kept)

    # The same pipeline with worker processes gives the same elements, and the
    # iterator's state, taken part way, restores the rest of the epoch.
    parallel = make_loader(source, workers=2)
    it = iter(parallel)
    head = [next(it) for _ in range(2)]
    state = it.get_state()
    rest = list(it)
    par_batches = head + rest
    assert sorted(int(k) for b in par_batches for k in b["key"]) == kept
    # Random maps are seeded per record: the same record gets the same noise.
    noise = {int(k): int(n) for b in batches for k, n in zip(b["key"], b["noise"])}
    par_noise = {int(k): int(n) for b in par_batches for k, n in zip(b["key"], b["noise"])}
    assert noise == par_noise

    resumed = iter(make_loader(source, workers=2))
    resumed.set_state(state)
    assert [b["key"].tolist() for b in resumed] == [b["key"].tolist() for b in rest]

    assert isinstance(loader, grain.DataLoader)
    print("ok")


if __name__ == "__main__":
    main()
