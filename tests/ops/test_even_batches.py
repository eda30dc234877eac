"""Ranks in step: the same number of batches on every shard, by dropping or padding the
tail, for MapDataset shards `[i::n]` with `batch` and for token-budget batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import chute
from chute.experimental import count_batches, zeros_like_batch
from chute.testing import assert_equal_output_after_checkpoint


@pytest.mark.parametrize("shards", [2, 3])
@pytest.mark.parametrize("n", [17, 18, 24, 31])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_map_shards_with_batch(shards: int, n: int, drop_remainder: bool) -> None:
    ds = chute.MapDataset.range(n).shuffle(seed=3)
    parts = [ds[i::shards].batch(4, drop_remainder=drop_remainder) for i in range(shards)]
    counts = [len(p) for p in parts]  # computable on every rank, no data read
    assert counts == [count_batches(p) for p in parts]

    low = [list(p.to_iter_dataset().even_batches(min(counts))) for p in parts]
    assert {len(b) for b in low} == {min(counts)}
    for p, got in zip(parts, low):
        assert [b.tolist() for b in got] == [p[j].tolist() for j in range(min(counts))]

    high = [
        list(p.to_iter_dataset().even_batches(max(counts), pad=zeros_like_batch)) for p in parts
    ]
    assert {len(b) for b in high} == {max(counts)}
    for p, got, c in zip(parts, high, counts):
        assert [b.tolist() for b in got[:c]] == [p[j].tolist() for j in range(c)]
        for b in got[c:]:
            assert b.shape == got[c - 1].shape and not b.any()
    # Every element is handed out once with padding; with the tail dropped, at most
    # (shards - 1) batches' worth are left out.
    real = sorted(int(x) for got, c in zip(high, counts) for b in got[:c] for x in b)
    assert len(real) == len(set(real))


def _sequences(lengths: list[int]) -> chute.MapDataset[dict[str, Any]]:
    return chute.MapDataset.source(lengths).map_with_index(
        lambda i, n: {"tokens": np.full(n, i + 1, np.int32), "id": i}
    )


def _length(x: dict[str, Any]) -> int:
    return len(x["tokens"])


def _token_shard(lengths: list[int], i: int, n: int) -> chute.IterDataset[Any]:
    return (
        _sequences(lengths)[i::n]
        .to_iter_dataset()
        .batch_by_tokens(96, length_fn=_length, window_size=40, seed=7)
    )


def _count_from_lengths(lengths: list[int], i: int, n: int) -> int:
    """The agreed count's cheap way: the same batching over the lengths alone."""
    only = chute.MapDataset.source(lengths)[i::n].to_iter_dataset()
    return count_batches(only.batch_by_tokens(96, length_fn=int, window_size=40, batch_fn=len))


@pytest.mark.parametrize("shards", [2, 3])
def test_token_batches_in_step(shards: int) -> None:
    rng = np.random.default_rng(shards)
    lengths = rng.integers(1, 60, size=301).tolist()
    counts = [_count_from_lengths(lengths, i, shards) for i in range(shards)]
    assert counts == [count_batches(_token_shard(lengths, i, shards)) for i in range(shards)]
    assert len(set(counts)) > 1  # uneven without the option: ranks would wait

    for k, pad in ((min(counts), None), (max(counts), zeros_like_batch)):
        seen: list[int] = []
        for i in range(shards):
            ds = _token_shard(lengths, i, shards).even_batches(k, pad=pad)
            out = list(ds)
            assert len(out) == k
            for b in out:
                assert b["tokens"].size <= 96
            seen.extend(int(x) for b in out for x in b["id"] if b["tokens"].any())
        assert len(seen) == len(set(seen))
        if pad is not None:
            assert sorted(seen) == list(range(len(lengths)))


def test_restore_at_every_step_including_padding() -> None:
    lengths = [(7 * i) % 23 + 1 for i in range(90)]
    shard = _token_shard(lengths, 1, 3)
    c = count_batches(shard)
    assert_equal_output_after_checkpoint(shard.even_batches(c + 4, pad=zeros_like_batch))
    assert_equal_output_after_checkpoint(shard.even_batches(c - 2))
    mapped = chute.MapDataset.range(29)[1::2].batch(3).to_iter_dataset()
    assert_equal_output_after_checkpoint(mapped.even_batches(8, pad=zeros_like_batch).repeat(2))


def test_a_shard_that_breaks_the_rule_raises_instead_of_hanging() -> None:
    ds = chute.MapDataset.range(10).batch(3).to_iter_dataset()  # 4 batches
    with pytest.raises(ValueError, match=r"ended after 4 batches, before num_batches=5.*smallest"):
        list(ds.even_batches(5))
    with pytest.raises(ValueError, match=r"more than num_batches=3 batches.*largest"):
        list(ds.even_batches(3, pad=zeros_like_batch))
    empty = chute.MapDataset.range(0).batch(3).to_iter_dataset()
    with pytest.raises(ValueError, match="no batch at all"):
        list(empty.even_batches(2, pad=zeros_like_batch))
    with pytest.raises(ValueError, match="num_batches=-1 is invalid"):
        ds.even_batches(-1)
    with pytest.raises(TypeError, match="pad=3 is not callable"):
        ds.even_batches(2, pad=3)  # type: ignore[arg-type]
