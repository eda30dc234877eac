"""The DataLoader API of seed 000, built on the Dataset engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

import chute
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


class Scale(chute.RandomMapTransform):
    def random_map(self, element: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return element * rng.uniform(0.8, 1.2)


class KeepEven(chute.FilterTransform):
    def filter(self, element: np.ndarray) -> bool:
        return int(element[0]) % 2 == 0


def seed_000_loader(**kwargs: object) -> chute.DataLoader:
    """The example of seed 000, with a concrete in-memory source."""
    data_source = [np.array([i, i + 1], dtype=np.int64) for i in range(100)]
    sampler = chute.IndexSampler(num_records=len(data_source), shuffle=True, seed=0, num_epochs=2)
    operations = [chute.TypeConversion(to_type=np.float32), Scale(), chute.Batch(batch_size=8)]
    return chute.DataLoader(
        data_source=data_source,
        sampler=sampler,
        operations=operations,
        worker_count=0,
        num_threads=0,
        **kwargs,  # type: ignore[arg-type]
    )


def test_seed_000_example_runs_and_is_deterministic() -> None:
    batches = list(seed_000_loader())
    assert len(batches) == 25 and batches[0].shape == (8, 2) and batches[0].dtype == np.float32
    assert_trees_equal(list(seed_000_loader()), batches)
    scales = np.concatenate([b[:, 1] - b[:, 0] for b in batches])  # (i+1)*s - i*s == s
    assert np.all((scales > 0.79) & (scales < 1.21)) and len(np.unique(scales)) > 150
    keys = np.concatenate([np.round(b[:, 0] / s) for b, s in zip(batches, np.split(scales, 25))])
    assert sorted(keys[:100].tolist()) == list(range(100))  # each epoch reads every record once


def test_loader_equals_the_dataset_pipeline() -> None:
    source = list(range(50))
    loader = chute.DataLoader(
        data_source=source,
        sampler=chute.IndexSampler(50, shuffle=True, seed=3, num_epochs=1),
        operations=[chute.Batch(5)],
        num_threads=0,
    )
    ds = chute.MapDataset.source(source).shuffle(seed=3).batch(5)
    assert [b.tolist() for b in loader] == [b.tolist() for b in ds]


def test_filter_then_batch_gives_full_batches() -> None:
    source = [np.array([i]) for i in range(40)]
    loader = chute.DataLoader(
        data_source=source,
        sampler=chute.SequentialSampler(40),
        operations=[KeepEven(), chute.Batch(batch_size=6, drop_remainder=True)],
        num_threads=0,
    )
    sizes = [len(b) for b in loader]
    assert sizes == [6, 6, 6]
    assert next(iter(loader))[:, 0].tolist() == [0, 2, 4, 6, 8, 10]


class Repeat(chute.experimental.FlatMapTransform):
    max_fan_out = 3

    def flat_map(self, element: int) -> list[int]:
        return [element] * (element % 3)


def test_flat_map_operation_is_applied_as_by_apply() -> None:
    # The loader dispatches its operations as ds.apply does: a flat map too (as Grain's
    # DataLoader), with the batches after it full, and its state restoring.
    def loader() -> chute.DataLoader:
        return chute.DataLoader(
            data_source=list(range(10)),
            sampler=chute.SequentialSampler(10),
            operations=[Repeat(), chute.Batch(batch_size=4)],
            num_threads=0,
        )

    ds = chute.MapDataset.range(10).to_iter_dataset().apply([Repeat(), chute.Batch(4)])
    expected = [[1, 2, 2, 4], [5, 5, 7, 8], [8]]
    assert [b.tolist() for b in ds] == expected
    assert [b.tolist() for b in loader()] == expected
    assert_equal_output_after_checkpoint(loader(), restore_into=loader())


def test_loader_state_restores_across_thread_counts() -> None:
    it = iter(seed_000_loader())
    for _ in range(9):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = list(it)
    other = iter(
        chute.DataLoader(
            data_source=[np.array([i, i + 1], dtype=np.int64) for i in range(100)],
            sampler=chute.IndexSampler(100, shuffle=True, seed=0, num_epochs=2),
            operations=[chute.TypeConversion(np.float32), Scale(), chute.Batch(8)],
            read_options=chute.ReadOptions(num_threads=3, prefetch_buffer_size=7),
        )
    )
    other.set_state(state)
    assert_trees_equal(list(other), rest)
    assert_equal_output_after_checkpoint(seed_000_loader(), max_elements=30)


@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_sharding_gives_every_record_to_exactly_one_shard(
    shuffle: bool, drop_remainder: bool
) -> None:
    n, shards = 103, 4
    per_shard = []
    for k in range(shards):
        options = chute.sharding.ShardOptions(k, shards, drop_remainder=drop_remainder)
        loader = chute.DataLoader(
            data_source=list(range(n)),
            sampler=chute.IndexSampler(n, shuffle=shuffle, seed=1, num_epochs=1),
            shard_options=options,
            num_threads=0,
        )
        per_shard.append(list(loader))
    everything = sorted(sum(per_shard, []))
    if drop_remainder:
        assert {len(s) for s in per_shard} == {n // shards}
        assert len(set(everything)) == len(everything) == n - n % shards
    else:
        assert everything == list(range(n))
        assert sorted(len(s) for s in per_shard) == [25, 26, 26, 26]


def test_sampler_record_metadata_matches_loader_order() -> None:
    sampler = chute.IndexSampler(20, shuffle=True, seed=9, num_epochs=2)
    keys: list[int] = []
    for i in range(len(sampler)):
        key = sampler[i].record_key
        assert key is not None
        keys.append(key)
    loader = chute.DataLoader(data_source=list(range(20)), sampler=sampler, num_threads=0)
    assert list(loader) == keys
    assert sorted(keys[:20]) == sorted(keys[20:]) == list(range(20)) and keys[:20] != keys[20:]
    meta = sampler[3]
    assert meta.index == 3 and isinstance(meta.rng, np.random.Generator)


def test_sampler_of_fewer_records_reads_the_first_ones() -> None:
    """As Grain's: a sampler of 5 records over a source of 100 reads records 0 to 4 (the
    DataLoader tutorial limits its output so), in the sampler's order."""
    sampler = chute.IndexSampler(5, shuffle=True, seed=0, num_epochs=2)
    keys: list[int] = []
    for i in range(len(sampler)):
        key = sampler[i].record_key
        assert key is not None
        keys.append(key)
    source = [f"record {i}" for i in range(100)]
    loader = chute.DataLoader(data_source=source, sampler=sampler, num_threads=0)
    assert list(loader) == [source[k] for k in keys]
    assert sorted(set(keys)) == list(range(5))


def test_custom_sampler() -> None:
    class Reverse:
        def __len__(self) -> int:
            return 5

        def __getitem__(self, i: int) -> chute.RecordMetadata:
            return chute.RecordMetadata(index=i, record_key=4 - i)

    loader = chute.DataLoader(data_source=list("abcde"), sampler=Reverse(), num_threads=0)
    assert list(loader) == list("edcba")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"worker_count": -1}, ValueError, r"worker_count=-1 is invalid"),
        (
            {"operations": [Scale()], "sampler": chute.SequentialSampler(4)},
            ValueError,
            r"no seed.*seed=42",
        ),
        ({"operations": [42]}, TypeError, r"operation 0, 42 of type int, is not an operation"),
        ({"sampler": 5}, TypeError, r"is not a sampler"),
        (
            {"sampler": chute.IndexSampler(5)},
            ValueError,
            r"samples 5 records, but the data source has only 4: .*num_records=len\(data_source\)",
        ),
        ({"num_threads": 0, "read_options": chute.ReadOptions()}, ValueError, r"pass one"),
        (
            {"shard_options": chute.sharding.ShardOptions(0, 2)},
            ValueError,
            r"conflicts with the sampler",
        ),
    ],
)
def test_loader_errors(kwargs: dict[str, object], error: type, message: str) -> None:
    args: dict[str, object] = {
        "data_source": [1, 2, 3, 4],
        "sampler": chute.IndexSampler(4, shard_options=chute.sharding.ShardOptions(1, 2)),
    }
    args.update(kwargs)
    with pytest.raises(error, match=message):
        chute.DataLoader(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_records": 0}, r"num_records=0 is invalid"),
        ({"num_records": 5, "shuffle": True}, r"shuffle=True needs a seed"),
        ({"num_records": 5, "num_epochs": 0}, r"num_epochs=0 is invalid"),
    ],
)
def test_sampler_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chute.IndexSampler(**kwargs)  # type: ignore[arg-type]


def test_shard_options_errors() -> None:
    with pytest.raises(ValueError, match=r"shard_index=3 is invalid.*\[0, shard_count=3\)"):
        chute.sharding.ShardOptions(3, 3)
    with pytest.raises(ValueError, match=r"shard_count=0 is invalid"):
        chute.sharding.ShardOptions(0, 0)
