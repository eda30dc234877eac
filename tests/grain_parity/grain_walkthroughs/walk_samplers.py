"""Samplers, as in Grain's sampler guide: an `IndexSampler` decides which record each step
reads, with shuffling, several epochs and sharding, and hands out `RecordMetadata`.
"""

import chute as grain
import chute.python as pygrain


def key_of(meta: grain.RecordMetadata) -> int:
    """The record key; a sampler always sets it (the type allows None)."""
    assert meta.record_key is not None
    return meta.record_key


def main() -> None:
    n = 10

    # No shuffle, one epoch: record keys in order, indices counting steps.
    plain = pygrain.IndexSampler(num_records=n, shard_options=pygrain.NoSharding(), num_epochs=1)
    metas = [plain[i] for i in range(n)]
    assert [key_of(m) for m in metas] == list(range(n))
    assert [m.index for m in metas] == list(range(n))
    assert all(isinstance(m, grain.RecordMetadata) for m in metas)
    try:
        plain[n]
    except IndexError:
        pass
    else:
        raise AssertionError("reading past the last epoch must raise IndexError")

    # Shuffled, two epochs: each epoch is a permutation of all records.
    shuffled = pygrain.IndexSampler(
        num_records=n, shard_options=pygrain.NoSharding(), shuffle=True, num_epochs=2, seed=1
    )
    keys = [key_of(shuffled[i]) for i in range(2 * n)]
    assert sorted(keys[:n]) == list(range(n))
    assert sorted(keys[n:]) == list(range(n))
    assert all(shuffled[i].rng is not None for i in range(3))  # a seed gives each record an rng
    # Same seed, same order.
    twin = pygrain.IndexSampler(
        num_records=n, shard_options=pygrain.NoSharding(), shuffle=True, num_epochs=2, seed=1
    )
    assert [key_of(twin[i]) for i in range(2 * n)] == keys

    # Sharding: two shards split the records between them, each reading its own part.
    parts = []
    for shard in range(2):
        options = pygrain.ShardOptions(shard_index=shard, shard_count=2, drop_remainder=True)
        sampler = pygrain.IndexSampler(num_records=n, shard_options=options, num_epochs=1)
        part = []
        i = shard
        while True:
            # Each shard reads global indices shard, shard + shard_count, ...
            try:
                part.append(key_of(sampler[i]))
            except IndexError:
                break
            i += 2
        parts.append(part)
    assert sorted(parts[0] + parts[1]) == list(range(n))
    assert not set(parts[0]) & set(parts[1])
    assert len(parts[0]) == len(parts[1]) == n // 2

    # A sampler drives the DataLoader; its metadata travels with each record.
    loader = pygrain.DataLoader(
        data_source=pygrain.RangeDataSource(0, n, 1),
        sampler=pygrain.IndexSampler(
            num_records=n, shard_options=pygrain.NoSharding(), shuffle=True, num_epochs=1, seed=3
        ),
        worker_count=0,
    )
    assert sorted(loader) == list(range(n))

    # SequentialSampler: one pass in order.
    seq = pygrain.SequentialSampler(num_records=4, shard_options=pygrain.NoSharding())
    assert [key_of(seq[i]) for i in range(4)] == [0, 1, 2, 3]

    print("ok")


if __name__ == "__main__":
    main()
