"""Packing: first-fit, best-fit, concat-then-split. Grain's outputs, token conservation,
exact restore at every step (mid-batch of bins and across epochs), errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.experimental import (
    BestFitPackIterDataset,
    BOSHandling,
    ConcatThenSplitIterDataset,
    FirstFitPackIterDataset,
)
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal

PACKERS = [FirstFitPackIterDataset, BestFitPackIterDataset]


def _source(lengths: list[int], **extra: Any) -> chute.IterDataset[Any]:
    seqs = [{"t": np.arange(1, n + 1) * 10 + i, **extra} for i, n in enumerate(lengths)]
    return chute.MapDataset.source(seqs).to_iter_dataset()


# Outputs of grain 0.2.18 for the same input (shuffle_bins=False, 3 bins of 8).
GRAIN_FIRST_FIT = [
    [10, 20, 30, 40, 12, 22, 14, 0],
    [11, 21, 31, 41, 51, 61, 16, 26],
    [13, 23, 33, 15, 25, 35, 45, 55],
    [17, 27, 37, 47, 57, 67, 77, 18],
    [19, 29, 39, 0, 0, 0, 0, 0],
]
GRAIN_BEST_FIT = [
    [10, 20, 30, 40, 13, 23, 33, 14],
    [11, 21, 31, 41, 51, 61, 12, 22],
    [15, 25, 35, 45, 55, 16, 26, 0],
    [17, 27, 37, 47, 57, 67, 77, 18],
    [19, 29, 39, 0, 0, 0, 0, 0],
]


@pytest.mark.parametrize(
    ("cls", "expected", "segments"),
    [
        (FirstFitPackIterDataset, GRAIN_FIRST_FIT, [1, 1, 1, 1, 2, 2, 3, 0]),
        (BestFitPackIterDataset, GRAIN_BEST_FIT, [1, 1, 1, 1, 2, 2, 2, 3]),
    ],
)
def test_same_rows_as_grain(cls: Any, expected: list[list[int]], segments: list[int]) -> None:
    ds = cls(
        _source([4, 6, 2, 3, 1, 5, 2, 7, 1, 3]),
        length_struct={"t": 8},
        num_packing_bins=3,
        shuffle_bins=False,
    )
    rows = list(ds)
    assert [r["t"].tolist() for r in rows] == expected
    assert rows[0]["t_segment_ids"].tolist() == segments
    assert list(rows[0]) == ["t", "t_segment_ids", "t_positions"]
    assert rows[0]["t_positions"].dtype == np.int32 and rows[0]["t"].dtype == np.int64


def _unpack(rows: list[dict[str, Any]], key: str) -> list[list[int]]:
    """The segments of every row, as lists, checking positions count up from 0."""
    out = []
    for r in rows:
        seg, pos, val = r[f"{key}_segment_ids"], r[f"{key}_positions"], r[key]
        assert (val[seg == 0] == 0).all()
        for s in range(1, int(seg.max(initial=0)) + 1):
            where = np.flatnonzero(seg == s)
            if len(where):
                assert where.tolist() == list(range(where[0], where[0] + len(where)))
                assert pos[where].tolist() == list(range(len(where)))
            out.append(val[where].tolist())
    return out


@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=60),
    bins=st.integers(1, 6),
    best=st.booleans(),
    shuffle=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_every_token_appears_exactly_once_in_order(
    lengths: list[int], bins: int, best: bool, shuffle: bool
) -> None:
    cls = PACKERS[best]
    ds = cls(_source(lengths), length_struct={"t": 12}, num_packing_bins=bins, shuffle_bins=shuffle)
    rows = list(ds)
    got = sorted(seg for seg in _unpack(rows, "t") if seg)
    want = sorted((np.arange(1, n + 1) * 10 + i).tolist() for i, n in enumerate(lengths) if n)
    assert got == want
    assert all(r["t"].shape == (12,) for r in rows)


@given(
    lengths=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 5)), min_size=1, max_size=30),
    bins=st.integers(1, 4),
    best=st.booleans(),
    align=st.integers(1, 3),
    max_seqs=st.sampled_from([None, 1, 2]),
)
@settings(max_examples=40, deadline=None)
def test_two_features_alignment_and_max_sequences_conserve_tokens(
    lengths: list[tuple[int, int]], bins: int, best: bool, align: int, max_seqs: int | None
) -> None:
    seqs = [
        {"a": np.arange(n) + 100 * i, "b": np.full((m, 2), i, np.float32), "id": i}
        for i, (n, m) in enumerate(lengths)
    ]
    ds = PACKERS[best](
        chute.MapDataset.source(seqs).to_iter_dataset(),
        length_struct={"a": 10, "b": 6},
        num_packing_bins=bins,
        meta_features=["id"],
        pack_alignment_struct={"a": align},
        padding_struct={"b": -1.0},
        max_sequences_per_bin=max_seqs,
    )
    rows = list(ds)
    got = sorted(s for s in _unpack(rows, "a"))
    assert got == sorted((np.arange(n) + 100 * i).tolist() for i, (n, _) in enumerate(lengths))
    ids = sorted(i for r in rows for i in r["id"])
    assert ids == list(range(len(lengths)))
    for r in rows:
        assert r["b"].shape == (6, 2) and r["b"].dtype == np.float32
        assert (r["b"][r["b_segment_ids"] == 0] == -1.0).all()
        if max_seqs:
            assert r["a_segment_ids"].max() <= max_seqs
        starts = np.flatnonzero(np.diff(r["a_segment_ids"], prepend=0) > 0)
        assert all(s % align == 0 for s in starts)


@pytest.mark.parametrize("cls", PACKERS)
@pytest.mark.parametrize("shuffle", [False, True])
def test_restore_at_every_step_mid_bins_and_across_epochs(cls: Any, shuffle: bool) -> None:
    lengths = [3, 7, 1, 5, 8, 2, 2, 6, 4, 1, 3]
    seqs = [{"t": np.arange(n) + 10 * i} for i, n in enumerate(lengths)]
    ds = (
        chute.MapDataset.source(seqs)
        .shuffle(seed=3)
        .repeat(3)
        .to_iter_dataset()
        .filter(lambda x: len(x["t"]) != 4)
    )
    packed = cls(ds, length_struct={"t": 9}, num_packing_bins=3, shuffle_bins=shuffle, seed=7)
    assert_equal_output_after_checkpoint(packed)
    assert_equal_output_after_checkpoint(packed.batch(2))


def test_shuffle_bins_is_deterministic_and_keyed_by_seed() -> None:
    def rows(seed: int) -> list[list[int]]:
        ds = FirstFitPackIterDataset(
            _source([3, 4, 2, 5, 1] * 6), length_struct={"t": 6}, num_packing_bins=8, seed=seed
        )
        return [r["t"].tolist() for r in ds]

    assert rows(1) == rows(1)
    assert rows(1) != rows(2)
    assert sorted(rows(1)) == sorted(rows(2))


@pytest.mark.parametrize("cls", PACKERS)
def test_too_long_sequences_are_rejected_or_split_never_cut(cls: Any) -> None:
    with pytest.raises(ValueError, match=r"element 1 is longer than a row .*'t' has 9 > 4"):
        list(cls(_source([2, 9]), length_struct={"t": 4}, num_packing_bins=2))
    ds = cls(
        _source([2, 9, 3]),
        length_struct={"t": 4},
        num_packing_bins=2,
        split_long_sequences=True,
        shuffle_bins=False,
    )
    rows = list(ds)
    flat = [t for seg in _unpack(rows, "t") for t in seg]
    assert sorted(flat) == sorted(
        [10, 20] + [int(x) for x in np.arange(1, 10) * 10 + 1] + [12, 22, 32]
    )
    assert_equal_output_after_checkpoint(ds)


def test_argument_and_element_errors() -> None:
    src = _source([1, 2])
    with pytest.raises(ValueError, match="num_packing_bins=0 is invalid"):
        FirstFitPackIterDataset(src, length_struct={"t": 4}, num_packing_bins=0)
    with pytest.raises(TypeError, match="length_struct=8 is invalid"):
        FirstFitPackIterDataset(src, length_struct=8, num_packing_bins=2)
    with pytest.raises(KeyError, match="element 0 has no feature 'x'"):
        list(FirstFitPackIterDataset(src, length_struct={"x": 4}, num_packing_bins=2))
    plain = chute.MapDataset.range(3).to_iter_dataset()
    with pytest.raises(TypeError, match="element 0 is a int, not a dict"):
        list(BestFitPackIterDataset(plain, length_struct={"t": 4}, num_packing_bins=2))


def test_bad_state_names_the_path() -> None:
    it = iter(FirstFitPackIterDataset(_source([1, 2]), length_struct={"t": 4}, num_packing_bins=2))
    state = it.get_state()
    del state["checksum"]  # edited on purpose: the values themselves are checked
    state["emitted"] = "x"
    with pytest.raises(chute.CheckpointError, match=r"state\['emitted'\] = 'x' is invalid"):
        it.set_state(state)


def test_seed_003_pipeline(corpus_records: list[bytes], tokenizer_path: Path) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    texts = [json.loads(r)["description"] for r in corpus_records[:400]]
    tokenized = [{"description": np.asarray(e.ids)} for e in tokenizer.encode_batch(texts)]
    sequence_length = 128
    ds = (
        chute.MapDataset.source(tokenized)
        .shuffle(seed=42)
        .repeat(num_epochs=2)[1::2]
        .map(lambda e: {"description": e["description"][:sequence_length]})
        .to_iter_dataset(chute.ReadOptions(num_threads=0))
    )
    packed = chute.experimental.FirstFitPackIterDataset(
        ds, length_struct={"description": sequence_length}, num_packing_bins=30
    )
    batch = next(iter(packed.batch(16, drop_remainder=True)))
    assert batch["description"].shape == (16, 128)
    assert batch["description_segment_ids"].dtype == np.int32
    assert (batch["description"][batch["description_segment_ids"] > 0] != 0).all()
    first = batch["description_positions"][:, 0].tolist()
    assert first == [0] * 16
    assert_equal_output_after_checkpoint(packed, max_elements=40, steps=range(0, 40, 7))


# -- concat then split -------------------------------------------------------------------


def test_concat_then_split_matches_grain() -> None:
    # grain 0.2.18's output for these inputs.
    ds = ConcatThenSplitIterDataset(_source([3, 6, 2, 5, 6, 4]), length_struct={"t": 6})
    assert [r["t"].tolist() for r in ds] == [
        [10, 20, 30, 11, 21, 31],
        [41, 51, 61, 12, 22, 13],
        [23, 33, 43, 53, 14, 24],
        [34, 44, 54, 64, 15, 25],
        [35, 45, 0, 0, 0, 0],
    ]
    passthrough = ConcatThenSplitIterDataset(
        _source([3, 6, 2]), length_struct={"t": 6}, split_full_length_features=False
    )
    assert [r["t_segment_ids"].tolist() for r in passthrough] == [
        [1, 1, 1, 2, 2, 0],
        [1, 1, 1, 1, 1, 1],
    ]


@given(
    lengths=st.lists(st.tuples(st.integers(0, 15), st.integers(0, 4)), min_size=1, max_size=25),
    cap=st.integers(1, 7),
    split_full=st.booleans(),
)
@settings(max_examples=40, deadline=None)
def test_concat_then_split_conserves_tokens_and_restores(
    lengths: list[tuple[int, int]], cap: int, split_full: bool
) -> None:
    seqs = [
        {"a": np.arange(n) + 100 * i, "b": np.arange(m) + 100 * i}
        for i, (n, m) in enumerate(lengths)
    ]
    ds = ConcatThenSplitIterDataset(
        chute.MapDataset.source(seqs).to_iter_dataset(),
        length_struct={"a": cap, "b": cap + 3},
        split_full_length_features=split_full,
    )
    rows = list(ds)
    for key, which in (("a", 0), ("b", 1)):
        tokens = [t for seg in _unpack(rows, key) for t in seg]
        want = [t for i, lens in enumerate(lengths) for t in range(100 * i, 100 * i + lens[which])]
        assert sorted(tokens) == want
    assert_equal_output_after_checkpoint(ds, max_elements=30)


def test_concat_then_split_bos_and_meta_features() -> None:
    seqs = [
        {"t": np.array([5, 6, 7]), "m": np.array([1])},
        {"t": np.array([8, 9]), "m": np.array([2])},
    ]
    ds = ConcatThenSplitIterDataset(
        chute.MapDataset.source(seqs).to_iter_dataset(),
        length_struct={"t": 4, "m": 2},
        meta_features=["m"],
        bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
        bos_features=["t"],
        bos_token_id=0,
    )
    rows = list(ds)
    assert [r["t"].tolist() for r in rows] == [[0, 6, 7, 0], [0, 0, 0, 0]]
    assert [r["m"].tolist() for r in rows] == [[1, 2], [2, 0]]
    assert "m_segment_ids" not in rows[0]
    with pytest.raises(ValueError, match="bos_handling=REPLACE_FIRST_TOKEN_WITH_BOS needs"):
        ConcatThenSplitIterDataset(
            _source([1]),
            length_struct={"t": 4},
            bos_handling=BOSHandling.REPLACE_FIRST_TOKEN_WITH_BOS,
        )
    with pytest.raises(ValueError, match=r"has features \['t', 'x'\] but length_struct"):
        list(ConcatThenSplitIterDataset(_source([1], x=1), length_struct={"t": 4}))


# -- worker processes ---------------------------------------------------------------------


def _worker_source(workers: int) -> chute.IterDataset[Any]:
    rng = np.random.default_rng(0)
    seqs = [{"t": rng.integers(1, 99, size=int(rng.integers(1, 20)))} for _ in range(300)]
    ds = chute.MapDataset.source(seqs).shuffle(seed=1).repeat(2).to_iter_dataset()
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))


@pytest.mark.parametrize("cls", [*PACKERS, ConcatThenSplitIterDataset])
def test_same_output_for_0_and_3_workers(cls: Any) -> None:
    def make(workers: int) -> chute.IterDataset[Any]:
        if cls is ConcatThenSplitIterDataset:
            return ConcatThenSplitIterDataset(_worker_source(workers), length_struct={"t": 24})
        return cls(_worker_source(workers), length_struct={"t": 24}, num_packing_bins=5, seed=3)

    assert_trees_equal(list(make(3)), list(make(0)))
    assert_equal_output_after_checkpoint(
        make(0), restore_into=make(3), max_elements=60, steps=[0, 1, 7, 29, 30, 59]
    )


def test_shuffle_bins_group_by_feature_keeps_groups_together() -> None:
    seqs = [
        {"t": np.arange(1, n + 1), "g": np.full(n, 1 + i % 3)} for i, n in enumerate([3, 5] * 12)
    ]
    ds = FirstFitPackIterDataset(
        chute.MapDataset.source(seqs).to_iter_dataset(),
        length_struct={"t": 5, "g": 5},
        meta_features=["g"],
        num_packing_bins=12,
        shuffle_bins_group_by_feature="g",
    )
    rows = list(ds)
    means = [float(np.unique(r["g"][r["g"] > 0]).mean()) for r in rows]
    assert means[:12] == sorted(means[:12])
    with pytest.raises(KeyError, match="shuffle_bins_group_by_feature='x' is not a feature"):
        list(
            FirstFitPackIterDataset(
                _source([1]),
                length_struct={"t": 4},
                num_packing_bins=2,
                shuffle_bins_group_by_feature="x",
            )
        )


@pytest.mark.parametrize("packer", PACKERS)
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_of_packed_rows_are_their_rows_stacked_and_resume(
    packer: Any, shuffle: bool
) -> None:
    from chute._src.core import tree

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 30, 300).tolist()
    seqs = [
        {"t": np.arange(n, dtype=np.int32) + i, "w": np.full(n, i / 7, np.float32)}
        for i, n in enumerate(lengths)
    ]

    def packed() -> chute.IterDataset[Any]:
        return packer(
            chute.MapDataset.source(seqs).to_iter_dataset(),
            length_struct={"t": 32, "w": 32},
            num_packing_bins=4,
            shuffle_bins=shuffle,
            seed=3,
        )

    # `batch` joins the packer's rows as columns; a batch_fn gets the rows themselves.
    joined: list[Any] = list(packed().batch(7))
    stacked = list(packed().batch(7, batch_fn=lambda rows: tree.stack(rows)))
    assert len(joined) == len(stacked) > 10
    for a, b in zip(joined, stacked, strict=True):
        assert list(a) == list(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
            np.testing.assert_array_equal(a[k], b[k])
    rows = list(packed())
    assert_trees_equal(rows[:7], [dict(zip(joined[0], r)) for r in zip(*joined[0].values())])
    assert_equal_output_after_checkpoint(packed().batch(7))
