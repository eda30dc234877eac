"""Dataset API basics, written the way a Grain user writes it (Grain's Dataset tutorial).

A `MapDataset` over an in-memory list: shuffle, map, filter, batch, slicing and sharding,
`to_iter_dataset`, and resuming an iterator from `get_state`/`set_state`.
"""

import chute as grain

WORDS = [f"w{i:02d}" for i in range(30)]


def main() -> None:
    # A source: any sequence with __len__ and __getitem__.
    base = grain.MapDataset.source(WORDS)
    assert len(base) == 30
    assert base[3] == "w03"
    assert list(grain.MapDataset.range(2, 8, 2)) == [2, 4, 6]

    # Shuffle permutes; the set of elements and the length stay the same.
    mixed = base.shuffle(seed=7)
    assert len(mixed) == 30
    assert sorted(mixed) == WORDS
    assert list(base.shuffle(seed=7)) == list(mixed)  # same seed: same order

    # map and filter are lazy; a filtered-out element reads as None by index.
    lengths = base.map(lambda w: int(w[1:]))
    assert lengths[12] == 12
    evens = lengths.filter(lambda n: n % 2 == 0)
    assert len(evens) == 30
    assert evens[3] is None and evens[4] == 4
    assert [n for n in evens if n is not None] == list(range(0, 30, 2))

    # batch stacks consecutive elements; the last partial batch is kept unless dropped.
    batches = grain.MapDataset.range(10).batch(batch_size=4)
    assert len(batches) == 3
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert len(grain.MapDataset.range(10).batch(batch_size=4, drop_remainder=True)) == 2

    # Slicing gives a view; a strided slice is the simplest way to shard.
    assert list(base[5:8]) == ["w05", "w06", "w07"]
    shard_a = base[0::2]
    shard_b = base[1::2]
    assert len(shard_a) == len(shard_b) == 15
    assert sorted([*shard_a, *shard_b]) == WORDS

    # Repeat, then an iterator over an iterable view of the pipeline.
    pipeline = (
        grain.MapDataset.source(WORDS)
        .shuffle(seed=3)
        .map(str.upper)
        .repeat(2)
        .to_iter_dataset()
        .batch(batch_size=6)
    )
    full = [b.tolist() for b in pipeline]
    assert len(full) == 10
    flat = [w for b in full for w in b]
    assert sorted(flat) == sorted([w.upper() for w in WORDS] * 2)

    # Checkpointing: the state after 4 batches restores the rest of the run exactly.
    it = iter(pipeline)
    for _ in range(4):
        next(it)
    saved = it.get_state()
    rest = [b.tolist() for b in it]
    assert rest == full[4:]
    fresh = iter(pipeline)
    fresh.set_state(saved)
    assert [b.tolist() for b in fresh] == rest

    print("ok")


if __name__ == "__main__":
    main()
