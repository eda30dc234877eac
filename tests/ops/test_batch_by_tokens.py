"""Token-budget batching: the budget, every element once, windows, padding, exact resume."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


def _sequences(lengths: list[int]) -> chute.MapDataset[dict[str, Any]]:
    """Element i: tokens of length lengths[i], every token equal to i + 1 (0 pads)."""
    return chute.MapDataset.source(lengths).map_with_index(
        lambda i, n: {"tokens": np.full(n, i + 1, np.int32), "id": i}
    )


def _length(x: dict[str, Any]) -> int:
    return len(x["tokens"])


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=120),
    budget=st.integers(40, 200),
    window=st.integers(1, 50),
    cap=st.one_of(st.none(), st.integers(1, 9)),
    multiple=st.one_of(st.none(), st.integers(1, 8)),
    sort=st.booleans(),
    seed=st.one_of(st.none(), st.integers(0, 5)),
)
@settings(max_examples=60, deadline=None)
def test_budget_every_element_once_and_windows(
    lengths: list[int],
    budget: int,
    window: int,
    cap: int | None,
    multiple: int | None,
    sort: bool,
    seed: int | None,
) -> None:
    if multiple and budget < -(-40 // multiple) * multiple:
        multiple = None
    ds = (
        _sequences(lengths)
        .to_iter_dataset()
        .batch_by_tokens(
            budget,
            length_fn=_length,
            max_batch_size=cap,
            pad_to_multiple_of=multiple,
            window_size=window,
            sort=sort,
            seed=seed,
        )
    )
    seen: list[int] = []
    for batch in ds:
        count, width = batch["tokens"].shape
        assert count * width <= budget
        assert cap is None or count <= cap
        if multiple:
            assert width % multiple == 0
        ids = batch["id"].tolist()
        assert width >= max(lengths[i] for i in ids)
        assert len({i // window for i in ids}) == 1  # never spans two windows
        for row, i in zip(batch["tokens"], ids):
            assert (row[: lengths[i]] == i + 1).all() and (row[lengths[i] :] == 0).all()
        if not sort:
            assert ids == sorted(ids)
        seen.extend(ids)
    assert sorted(seen) == list(range(len(lengths)))
    # Windows come out in order: each window's elements before the next window's.
    windows = [i // window for i in seen]
    assert windows == sorted(windows)


def test_sorted_windows_pad_less_than_fixed_batches() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, size=2000).tolist()
    ds = _sequences(lengths).to_iter_dataset()
    budget = 2048
    tokens = sum(lengths)
    padded = sum(b["tokens"].size for b in ds.batch_by_tokens(budget, length_fn=_length))
    fixed = sum(b["tokens"].size for b in ds.batch(16, pad_value=0))
    assert padded < 1.1 * tokens < fixed


def test_seed_shuffles_the_order_of_a_windows_batches() -> None:
    lengths = [(7 * i) % 31 + 1 for i in range(300)]
    ds = _sequences(lengths).to_iter_dataset()

    def order(seed: int | None) -> list[list[int]]:
        out = ds.batch_by_tokens(64, length_fn=_length, window_size=100, seed=seed)
        return [b["id"].tolist() for b in out]

    plain, one, two = order(None), order(1), order(2)
    assert one == order(1) and one != plain and one != two
    assert sorted(map(sorted, one)) == sorted(map(sorted, plain))
    firsts = [max(len(b) for b in plain[:3])]
    assert firsts  # shortest first without a seed: the widest batches come last
    widths = [max(lengths[i] for i in b) for b in plain if b[0] < 100]
    assert widths == sorted(widths)


def test_drop_remainder_drops_only_the_last_windows_partial_batch() -> None:
    lengths = [4] * 23  # budget 16: batches of 4; windows of 10 -> 4, 4, 2 | 4, 4, 2 | ...
    ds = _sequences(lengths).to_iter_dataset()
    kept = [b["id"].tolist() for b in ds.batch_by_tokens(16, length_fn=_length, window_size=10)]
    dropped = [
        b["id"].tolist()
        for b in ds.batch_by_tokens(16, length_fn=_length, window_size=10, drop_remainder=True)
    ]
    assert [len(b) for b in kept] == [4, 4, 2, 4, 4, 2, 3]
    assert dropped == kept[:-1]
    # A full last batch stays; a last window of exactly window_size elements is found by
    # reading one element ahead.
    full = _sequences([4] * 24).to_iter_dataset()
    assert [
        len(b["id"])
        for b in full.batch_by_tokens(16, length_fn=_length, window_size=12, drop_remainder=True)
    ] == [4] * 6
    exact = _sequences([4] * 20).to_iter_dataset()
    assert [
        len(b["id"])
        for b in exact.batch_by_tokens(16, length_fn=_length, window_size=10, drop_remainder=True)
    ] == [4, 4, 2, 4, 4]


def test_errors_name_the_value_and_the_fix() -> None:
    ds = _sequences([3, 50, 2]).to_iter_dataset()
    with pytest.raises(ValueError, match=r"input element 1 has length 50 > max_tokens=40.*cut"):
        list(ds.batch_by_tokens(40, length_fn=_length))
    with pytest.raises(ValueError, match=r"length 3 \(padded to 8\) > max_tokens=7"):
        list(
            _sequences([3])
            .to_iter_dataset()
            .batch_by_tokens(7, length_fn=_length, pad_to_multiple_of=8)
        )
    with pytest.raises(ValueError, match=r"max_tokens=0 is invalid: it must be a positive int"):
        ds.batch_by_tokens(0, length_fn=_length)
    with pytest.raises(ValueError, match=r"window_size=-1 is invalid"):
        ds.batch_by_tokens(10, length_fn=_length, window_size=-1)
    with pytest.raises(TypeError, match=r"length_fn=3 is not callable"):
        ds.batch_by_tokens(10, length_fn=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"length_fn returned 'x' for input element 0"):
        list(ds.batch_by_tokens(100, length_fn=lambda x: "x"))  # type: ignore[arg-type,return-value]


def test_batch_fn_and_plain_arrays() -> None:
    ds = chute.MapDataset.range(1, 7).map(lambda n: np.arange(n)).to_iter_dataset()
    out = list(ds.batch_by_tokens(12, length_fn=len, pad_value=-1, window_size=6))
    assert out[0].tolist() == [[0, -1, -1], [0, 1, -1], [0, 1, 2]]
    lists = list(ds.batch_by_tokens(12, length_fn=len, batch_fn=lambda xs: [len(x) for x in xs]))
    assert lists == [[1, 2, 3], [4, 5], [6]]


def test_restore_at_every_step_with_small_state() -> None:
    lengths = [(11 * i) % 29 + 1 for i in range(90)]
    ds = (
        _sequences(lengths)
        .repeat(2)
        .to_iter_dataset()
        .filter(lambda x: x["id"] % 7 != 3)
        .batch_by_tokens(60, length_fn=_length, window_size=17, seed=4, drop_remainder=True)
    )
    assert_equal_output_after_checkpoint(ds)
    it = iter(ds)
    for _ in range(5):
        next(it)
    state = it.get_state()
    # (How far its reader had read upstream, "fetched" and "chunk": two ints.)
    assert set(state) - {"checksum"} == {
        "stage",
        "params",
        "skip",
        "piece",
        "window",
        "fetched",
        "chunk",
        "parent",
    }
    # The window's elements are never in the state: a window 100 times larger, same size.
    big = (
        _sequences(lengths * 50)
        .to_iter_dataset()
        .batch_by_tokens(60, length_fn=_length, window_size=1700, seed=4)
    )
    it2 = iter(big)
    for _ in range(5):
        next(it2)
    assert len(json.dumps(it2.get_state())) < 2 * len(json.dumps(state))


def test_a_state_from_another_budget_is_refused() -> None:
    ds = _sequences([3] * 20).to_iter_dataset()
    it = iter(ds.batch_by_tokens(12, length_fn=_length))
    next(it)
    other = iter(ds.batch_by_tokens(9, length_fn=_length))
    with pytest.raises(chute.CheckpointError, match="max_tokens=12"):
        other.set_state(it.get_state())


def _workers(n: int) -> chute.IterDataset[Any]:
    lengths = [(13 * i) % 37 + 1 for i in range(400)]
    ds = (
        _sequences(lengths)
        .shuffle(seed=2)
        .to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=n))
    )
    return ds.batch_by_tokens(256, length_fn=_length, window_size=64, seed=1)


def test_same_batches_for_0_1_and_3_workers() -> None:
    reference = list(_workers(0))
    assert_trees_equal(list(_workers(1)), reference)
    assert_trees_equal(list(_workers(3)), reference)
    assert_equal_output_after_checkpoint(
        _workers(3), restore_into=_workers(0), steps=[0, 1, 7, 30, len(reference)]
    )
    assert_equal_output_after_checkpoint(_workers(0), restore_into=_workers(1), steps=[0, 5, 19])


def test_the_examples_of_docs_sequences_run() -> None:
    """The code blocks of docs/sequences.md run as shown, in order, in one namespace."""
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "sequences.md"
    blocks = re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert len(blocks) >= 4
    namespace: dict[str, Any] = {}
    for block in blocks:
        exec(compile(block, str(doc), "exec"), namespace)


def _sharded(n: int) -> chute.IterDataset[Any]:
    """The stage inside worker processes: one token-batched stream per shard, read whole
    by a worker under mp_prefetch, merged by the interleave in this process."""
    shards = [
        _sequences([(5 * i + k) % 31 + 1 for i in range(120)])
        .to_iter_dataset()
        .batch_by_tokens(128, length_fn=_length, window_size=30, seed=k)
        for k in range(4)
    ]
    merged = chute.experimental.InterleaveIterDataset(shards, cycle_length=2)
    return merged.mp_prefetch(chute.MultiprocessingOptions(num_workers=n))


def test_inside_worker_processes_per_shard() -> None:
    reference = list(_sharded(0))
    assert_trees_equal(list(_sharded(1)), reference)
    assert_trees_equal(list(_sharded(3)), reference)
    assert_equal_output_after_checkpoint(
        _sharded(3), restore_into=_sharded(0), steps=[0, 5, 21], same_shape=False
    )
