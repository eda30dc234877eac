"""Caches: in memory and on disk; later passes skip the pipeline; a changed pipeline never
reuses another's cache; exact restore; elements round-trip without pickle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import chute
from chute._src.core import contract
from chute._src.core.tree_codec import decode, encode
from chute.testing import assert_equal_output_after_checkpoint, assert_trees_equal


class Counter:
    """A map that counts its calls (the expensive part of a pipeline)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, i: int) -> dict[str, Any]:
        self.calls += 1
        return {"ids": np.arange(i % 7, dtype=np.int32), "label": i, "name": f"r{i}"}


def _pipeline(counter: Counter, n: int = 20) -> chute.IterDataset[Any]:
    return chute.MapDataset.range(n).shuffle(seed=1).to_iter_dataset().map(counter)


@pytest.mark.parametrize("on_disk", [False, True])
def test_later_passes_come_from_the_cache(on_disk: bool, tmp_path: Path) -> None:
    counter = Counter()
    cached = _pipeline(counter).cache(tmp_path if on_disk else None)
    out = list(cached.repeat(3))
    assert counter.calls == 20
    assert_trees_equal(out[20:40], out[:20])
    assert_trees_equal(out[40:], out[:20])
    assert_trees_equal(out[:20], list(_pipeline(Counter())))


def test_disk_cache_is_reused_across_runs_and_placed_before_or_after_a_map(tmp_path: Path) -> None:
    first = Counter()
    list(_pipeline(first).cache(tmp_path))
    again = Counter()
    assert_trees_equal(list(_pipeline(again).cache(tmp_path)), list(_pipeline(Counter())))
    assert again.calls == 0  # a new run reads the files
    before_map = chute.MapDataset.range(10).to_iter_dataset().cache(tmp_path).map(lambda x: x * 3)
    assert list(before_map.repeat(2)) == [x * 3 for x in range(10)] * 2


def test_a_different_pipeline_never_reuses_a_cache(tmp_path: Path) -> None:
    base = chute.MapDataset.range(5).to_iter_dataset()
    assert list(base.map(lambda x: x + 1).cache(tmp_path)) == [1, 2, 3, 4, 5]
    assert list(base.map(lambda x: x + 2).cache(tmp_path)) == [2, 3, 4, 5, 6]
    assert list(base.filter(lambda x: x > 2).cache(tmp_path)) == [3, 4]
    other_data = chute.MapDataset.source([7, 8, 9, 10, 11]).to_iter_dataset()
    assert list(other_data.cache(tmp_path)) == [7, 8, 9, 10, 11]
    shuffled = chute.MapDataset.range(5).shuffle(seed=1).to_iter_dataset()
    reshuffled = chute.MapDataset.range(5).shuffle(seed=2).to_iter_dataset()
    assert list(shuffled.cache(tmp_path)) != list(reshuffled.cache(tmp_path))
    assert len(list(tmp_path.iterdir())) == 6


def test_an_interrupted_pass_leaves_no_cache(tmp_path: Path) -> None:
    counter = Counter()
    cached = _pipeline(counter).cache(tmp_path)
    it = iter(cached)
    for _ in range(5):
        next(it)
    it.close()
    assert not list(tmp_path.glob("*/*.crec"))
    assert len(list(cached)) == 20 and list(tmp_path.glob("*/*.crec"))


@pytest.mark.parametrize("on_disk", [False, True])
def test_restore_at_every_step_while_building_and_reading(on_disk: bool, tmp_path: Path) -> None:
    cached = _pipeline(Counter(), 9).cache(tmp_path if on_disk else None)
    assert_equal_output_after_checkpoint(cached.repeat(3).batch(2, pad_value=-1))
    # States taken while reading the cache restore into a fresh process's iterator.
    it = iter(cached.repeat(2))
    for _ in range(12):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = list(it)
    fresh = iter(_pipeline(Counter(), 9).cache(tmp_path if on_disk else None).repeat(2))
    fresh.set_state(state)
    assert_trees_equal(list(fresh), rest)


def test_errors_name_the_fix(tmp_path: Path) -> None:
    ds = chute.MapDataset.source([{1: "a"}]).to_iter_dataset()
    with pytest.raises(TypeError, match=r"element has non-string keys \[1\]"):
        list(ds.cache(tmp_path))
    objs = chute.MapDataset.source([{"x": object()}]).to_iter_dataset()
    with pytest.raises(TypeError, match=r"element\['x'\] is a object, which chute cannot store"):
        list(objs.cache(tmp_path))
    with pytest.raises(TypeError, match="path=3 is invalid"):
        chute.MapDataset.range(2).to_iter_dataset().cache(3)  # type: ignore[arg-type]


leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=5),
    hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=3, max_side=3)),
)
trees = st.recursive(
    leaves,
    lambda c: st.one_of(
        st.lists(c, max_size=3),
        st.lists(c, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=3), c, max_size=3),
    ),
    max_leaves=8,
)


@given(tree=trees)
@settings(max_examples=150, deadline=None)
def test_any_tree_round_trips_with_its_types(tree: Any) -> None:
    back = decode(encode(tree))
    _same(back, tree)


def _same(a: Any, b: Any) -> None:
    assert type(a) is type(b)
    if isinstance(b, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b, equal_nan=b.dtype.kind in "fc") or (a.tobytes() == b.tobytes())
    elif isinstance(b, dict):
        assert list(a) == list(b)
        for k in b:
            _same(a[k], b[k])
    elif isinstance(b, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b or (a != a and b != b)


def _workers(n: int, path: Path | None) -> chute.IterDataset[Any]:
    ds = chute.MapDataset.range(60).shuffle(seed=5).to_iter_dataset()
    ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=n))
    return ds.cache(path).repeat(2)


@pytest.mark.parametrize("on_disk", [False, True])
def test_same_output_for_0_and_3_workers(on_disk: bool, tmp_path: Path) -> None:
    path = tmp_path if on_disk else None
    assert_trees_equal(list(_workers(3, path)), list(_workers(0, path)))
    assert_equal_output_after_checkpoint(
        _workers(0, path), restore_into=_workers(3, path), steps=[0, 1, 59, 60, 61, 119, 120]
    )


def test_the_key_ignores_worker_counts_and_memo_tables(tmp_path: Path) -> None:
    base = chute.MapDataset.range(50).shuffle(seed=1)
    first = base.to_iter_dataset().cache(tmp_path)
    list(first)  # fills the shuffle's memo table
    options = chute.MultiprocessingOptions(num_workers=2)
    assert base.to_iter_dataset().cache(tmp_path).directory == first.directory  # type: ignore[attr-defined]
    a = base.to_iter_dataset().mp_prefetch(options).cache(tmp_path)
    b = (
        base.to_iter_dataset()
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=0))
        .cache(tmp_path)
    )
    assert a.directory == b.directory  # type: ignore[attr-defined]


class _Scaled(chute.IterDataset[int]):
    """A user stage whose setting sits in a dict: by default hashed by its type only."""

    def __init__(self, parent: chute.IterDataset[int], scale: int, declared: bool) -> None:
        super().__init__([parent])
        self._settings = {"scale": scale}
        self._declared = declared

    def _make_iterator(self) -> chute.DatasetIterator[int]:
        return _ScaledIterator(self._parent_iter(), self._settings["scale"])

    def _cache_identity(self) -> dict[str, Any]:
        identity = super()._cache_identity()
        if self._declared:
            identity["scale"] = self._settings["scale"]
        return identity


class _ScaledIterator(chute.DatasetIterator[int]):
    def __init__(self, parent: chute.DatasetIterator[int], scale: int) -> None:
        super().__init__(parent)
        self._scale = scale

    def __next__(self) -> int:
        return next(self._parent) * self._scale


def test_a_stage_declares_what_decides_its_elements_in_cache_identity(tmp_path: Path) -> None:
    def cached(scale: int, declared: bool) -> Any:
        base = chute.MapDataset.range(5).to_iter_dataset()
        return _Scaled(base, scale, declared).cache(tmp_path)

    # Without the override the setting is invisible to the key: both share one cache.
    assert cached(2, False).directory == cached(3, False).directory
    # Declared, it gets its own cache, and each reads its own elements back.
    assert cached(2, True).directory != cached(3, True).directory
    for scale in (2, 3, 2):
        assert list(cached(scale, True)) == [scale * i for i in range(5)]

    # The reader leaves its ReadOptions out of its identity: thread counts change no key.
    def reader(threads: int) -> Any:
        return chute.MapDataset.range(5).to_iter_dataset(chute.ReadOptions(num_threads=threads))

    assert "_read_options" not in contract.cache_identity(reader(3))
    assert reader(3).cache(tmp_path).directory == reader(0).cache(tmp_path).directory


class CountingRecords:
    """An iterable of `n` records that counts the records read from it (a file's reader)."""

    def __init__(self, n: int) -> None:
        self.n, self.read = n, 0

    def __iter__(self) -> Any:
        for i in range(self.n):
            self.read += 1
            yield i


@pytest.mark.parametrize(
    "ahead",
    [
        lambda ds: chute.experimental.InterleaveIterDataset([ds], cycle_length=1),
        lambda ds: ds.prefetch(2),
    ],
    ids=["interleave", "prefetch"],
)
@pytest.mark.parametrize("on_disk", [False, True])
def test_a_pass_from_the_cache_leaves_the_parent_unread(
    ahead: Any, on_disk: bool, tmp_path: Path
) -> None:
    """The passes a `repeat` serves from the cache leave the parent where its pass ended:
    rewinding it would start its read-ahead again (an interleave's threads, a prefetch
    thread), reading the source once more for nothing. States taken while replaying
    still restore exactly."""
    path = tmp_path if on_disk else None
    records = CountingRecords(5)
    ds = ahead(chute.IterDataset.source(records)).cache(path).repeat(3)
    with iter(ds) as it:
        assert list(it) == [*range(5)] * 3
    assert records.read == 5  # closed: read-ahead in flight has finished or stopped
    again = ahead(chute.IterDataset.source(range(5))).cache(path).repeat(3)
    assert_equal_output_after_checkpoint(again)
