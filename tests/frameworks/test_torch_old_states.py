"""`chute.torch.IterableDataset` states saved by the chute before states could be merged
(`{"epoch", "shard", "iterator"}`) still restore, to the same continuation. The states
below were captured from that version (at d8e6d48)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

import chute
from chute._src.frameworks.sharding import ShardOptions
from chute.torch import IterableDataset

# Rank 1 of 2, no torch workers, two batches of 4 read from a filtered, shuffled range;
# the old version then gave [[19, 27, 39, 2], [17, 28, 24, 36], [8]].
FILTERED = json.loads(
    '{"epoch": 0, "shard": [1, 2, 0, 1], "iterator": {"chute_state": "{\\"stage\\": '
    '\\"batch\\", \\"params\\": \\"batch_size=4, drop_remainder=False\\", \\"parent\\": '
    '{\\"stage\\": \\"to_iter_dataset\\", \\"next_index\\": 8, \\"pipeline\\": '
    '[\\"Range(start=0, stop=40, step=1)\\", \\"Shuffle(seed=17027085370592858547)\\", '
    '\\"Filter()\\", \\"Repeat(num_epochs=1)\\", \\"Slice(0:40:1)\\", \\"Slice(1:40:2)\\", '
    '\\"Slice(0:20:1)\\"]}}"}}'
)


def dataset(rank: int = 1) -> IterableDataset:
    ds = chute.MapDataset.range(40).shuffle(seed=3).filter(lambda x: x % 5 != 0)
    return IterableDataset(ds, batch_size=4, shard_options=ShardOptions(rank, 2))


def test_an_old_state_continues_as_it_did() -> None:
    ds = dataset()
    ds.load_state_dict(FILTERED)
    assert [b.tolist() for b in ds] == [[19, 27, 39, 2], [17, 28, 24, 36], [8]]


def test_an_old_state_continues_as_an_uninterrupted_run_does() -> None:
    whole = [b.tolist() for b in dataset()]
    ds = dataset()
    ds.load_state_dict(FILTERED)
    assert [b.tolist() for b in ds] == whole[2:]
    assert ds.epoch == 1


def test_an_old_state_at_an_epochs_start_and_of_another_dataset() -> None:
    ds = dataset()
    ds.load_state_dict({"epoch": 1, "shard": [1, 2, 0, 1], "iterator": None})
    assert ds.epoch == 1 and len(list(ds)) > 0
    other = IterableDataset(
        chute.MapDataset.range(40).shuffle(seed=4), batch_size=4, shard_options=ShardOptions(1, 2)
    )
    with pytest.raises(chute.CheckpointError, match=r"does not begin with this dataset's"):
        other.load_state_dict(FILTERED)
    with pytest.raises(chute.CheckpointError, match=r"rank 1 of 2.*rank 0 of 2"):
        wrong = dataset(rank=0)
        wrong.load_state_dict(FILTERED)
        list(wrong)
