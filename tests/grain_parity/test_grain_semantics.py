"""Grain's semantics, stated side by side with Grain where it is installed.

Each test says what Grain (0.2.18) does and checks that chute does the same; where Grain is
importable, the test runs Grain too (chute itself never imports it).
"""

from __future__ import annotations

import json
import logging
import re
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import chute
from chute import experimental as ex
from chute.testing import assert_equal_output_after_checkpoint


def _grain() -> ModuleType:
    return pytest.importorskip("grain", reason="grain not installed: Grain's side is skipped")


# -- 1. the checkpoint checker: a state keeps its shape, and set_state/get_state round-trip


class _Growing(chute.DatasetIterator[int]):
    """A stage whose state grows: a list of everything handed out."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: list[int] = []

    def __next__(self) -> int:
        if len(self._seen) >= 4:
            raise StopIteration
        self._seen.append(len(self._seen))
        return self._seen[-1]

    def get_state(self) -> dict[str, Any]:
        return {"seen": list(self._seen)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._seen = list(state["seen"])


class _Forgetful(chute.DatasetIterator[int]):
    """A stage that restores its position but reports it another (equivalent) way."""

    def __init__(self) -> None:
        super().__init__()
        self._i = 0
        self._extra = 0

    def __next__(self) -> int:
        if self._i >= 4:
            raise StopIteration
        self._i += 1
        return self._i - 1

    def get_state(self) -> dict[str, Any]:
        return {"i": self._i, "restored": self._extra}

    def set_state(self, state: dict[str, Any]) -> None:
        self._i, self._extra = state["i"], 1


class _Stream(chute.IterDataset[int]):
    def __init__(self, make: Any) -> None:
        super().__init__()
        self._make = make

    def __iter__(self) -> chute.DatasetIterator[int]:
        return self._make()


def test_checker_rejects_a_state_that_changes_shape() -> None:
    with pytest.raises(AssertionError, match="state's shape changed at step 1"):
        assert_equal_output_after_checkpoint(_Stream(_Growing))
    assert_equal_output_after_checkpoint(_Stream(_Growing), same_shape=False)


def test_checker_rejects_get_state_after_set_state_that_differs() -> None:
    with pytest.raises(AssertionError, match=r"get_state\(\) right after set_state\(s\)"):
        assert_equal_output_after_checkpoint(_Stream(_Forgetful))


def test_grains_checker_makes_the_same_two_checks() -> None:
    _grain()
    from grain._src.python.testing.experimental import (
        assert_equal_output_after_checkpoint as grain_check,
    )

    with pytest.raises(AssertionError, match="State spec does not match"):
        grain_check(_Stream(_Growing))
    with pytest.raises(AssertionError, match="Restored state does not match"):
        grain_check(_Stream(_Forgetful))


def _tokens(lengths: list[int]) -> chute.IterDataset[dict[str, Any]]:
    seqs = [{"t": np.arange(1, n + 1)} for n in lengths]
    return chute.MapDataset.source(seqs).to_iter_dataset()


def test_concat_then_split_state_keeps_its_shape() -> None:
    ds = ex.ConcatThenSplitIterDataset(_tokens([3, 6, 2, 5, 1, 7]), length_struct={"t": 4})
    assert_equal_output_after_checkpoint(ds)
    # Grain's state of the same stage keeps one shape too.
    grain = _grain()
    from grain._src.python.testing.experimental import (
        assert_equal_output_after_checkpoint as grain_check,
    )

    seqs = [{"t": np.arange(1, n + 1)} for n in [3, 6, 2, 5, 1, 7]]
    gds = grain.experimental.ConcatThenSplitIterDataset(
        grain.MapDataset.source(seqs).to_iter_dataset(), length_struct={"t": 4}
    )
    grain_check(gds)


def test_concat_then_split_restores_a_state_of_the_older_layout() -> None:
    ds = ex.ConcatThenSplitIterDataset(_tokens([3, 6, 2, 5]), length_struct={"t": 4})
    it = iter(ds)
    next(it), next(it)
    state = it.get_state()
    rest = [r["t"].tolist() for r in it]
    assert state["has_remainder"]
    old = {k: v for k, v in state.items() if k not in ("has_remainder", "checksum")}
    it = iter(ds)
    it.set_state(json.loads(json.dumps(old)))
    assert [r["t"].tolist() for r in it] == rest
    first = iter(ds).get_state()
    old = {k: v for k, v in first.items() if k not in ("has_remainder", "checksum")}
    old["remainder"] = []
    it = iter(ds)
    it.set_state(old)
    assert len(list(it)) == 4


class _Copies(ex.FlatMapTransform):
    max_fan_out = 3

    def flat_map(self, x: int) -> list[int]:
        return [x] * (x % 3)


@pytest.mark.parametrize(
    "build",
    [
        lambda: ex.RebatchIterDataset(
            chute.MapDataset.range(10).batch(3).to_iter_dataset(), batch_size=2
        ),
        lambda: ex.WindowShuffleIterDataset(
            chute.MapDataset.range(30).to_iter_dataset(), window_size=7, seed=1
        ),
        lambda: ex.FlatMapIterDataset(chute.MapDataset.range(12).to_iter_dataset(), _Copies()),
        lambda: ex.InterleaveIterDataset(
            [chute.MapDataset.range(10 * i, 10 * i + 1 + i) for i in range(5)], cycle_length=2
        ),
        lambda: chute.MapDataset.range(9).to_iter_dataset().cache().repeat(3),
    ],
    ids=["rebatch", "window_shuffle", "flat_map", "interleave", "cache"],
)
def test_get_state_after_set_state_is_the_state(build: Any) -> None:
    assert_equal_output_after_checkpoint(build())


# -- 2. parameters Grain has ---------------------------------------------------------------


def _odd(x: int) -> bool:
    return x % 2 == 1


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_mp_prefetch_sequential_slice_gives_grains_order_of_contiguous_shares(
    workers: int,
) -> None:
    """Without the flag the output is in index order for any worker count; with it, each of
    `num_workers` takes a contiguous share and their outputs alternate, as in Grain."""
    ds = chute.MapDataset.range(40).shuffle(seed=3).to_iter_dataset()
    options = chute.MultiprocessingOptions(num_workers=workers)
    plain = list(ds.mp_prefetch(options))
    assert plain == list(ds)
    shares = [x for pair in zip(plain[:20], plain[20:]) for x in pair]
    expected = shares if workers == 2 else plain  # one share (or none): the whole
    assert list(ds.mp_prefetch(options, sequential_slice=True)) == expected
    with pytest.raises(TypeError, match="sequential_slice"):
        ds.mp_prefetch(options, sequential_slice="yes")  # type: ignore[arg-type]


def test_to_iter_dataset_allow_nones_yields_none_for_filtered_elements() -> None:
    ds = chute.MapDataset.range(6).filter(_odd)
    assert list(ds.to_iter_dataset()) == [1, 3, 5]
    with_nones = ds.to_iter_dataset(allow_nones=True)
    assert list(with_nones) == [None, 1, None, 3, None, 5]
    threads = chute.ReadOptions(num_threads=2, prefetch_buffer_size=4)
    assert list(ds.to_iter_dataset(threads, allow_nones=True)) == list(with_nones)
    assert_equal_output_after_checkpoint(with_nones)
    grain = _grain()
    gds = grain.MapDataset.range(6).filter(_odd)
    assert list(gds.to_iter_dataset(allow_nones=True)) == list(with_nones)


def _none_to_minus_one(x: int | None) -> int:
    return -1 if x is None else x


@pytest.mark.parametrize("workers", [0, 2])
def test_allow_nones_reaches_the_stages_after_it_with_workers(workers: int) -> None:
    ds = (
        chute.MapDataset.range(8)
        .filter(_odd)
        .to_iter_dataset(allow_nones=True)
        .map(_none_to_minus_one)
        .mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    )
    assert list(ds) == [-1, 1, -1, 3, -1, 5, -1, 7]


def test_zip_strict_as_grain() -> None:
    def streams() -> list[chute.IterDataset[int]]:
        return [chute.MapDataset.range(n).to_iter_dataset() for n in (3, 5)]

    assert list(ex.ZipIterDataset(streams(), strict=False)) == [(0, 0), (1, 1), (2, 2)]
    with pytest.raises(ValueError, match="ZipIterDataset argument 2 is longer than argument 1"):
        list(ex.ZipIterDataset(streams()))
    with pytest.raises(ValueError, match="argument 2 is shorter than argument 1"):
        list(ex.ZipIterDataset(streams()[::-1]))
    equal = [chute.MapDataset.range(4).to_iter_dataset() for _ in range(3)]
    assert len(list(ex.ZipIterDataset(equal))) == 4
    # _next_many (a batch after the zip) gives the same error after the same rows.
    it = iter(ex.ZipIterDataset(streams()).batch(2))
    assert next(it)[0].tolist() == [0, 1]
    assert next(it)[0].tolist() == [2]
    with pytest.raises(ValueError, match="argument 2 is longer"):
        next(it)
    grain = _grain()
    g = [grain.MapDataset.range(n).to_iter_dataset() for n in (3, 5)]
    with pytest.raises(ValueError, match="ZipIterDataset argument 2 is longer than argument 1"):
        list(grain.experimental.ZipIterDataset(g))
    g = [grain.MapDataset.range(n).to_iter_dataset() for n in (3, 5)]
    assert list(grain.experimental.ZipIterDataset(g, strict=False)) == [(0, 0), (1, 1), (2, 2)]


class _Unbounded(ex.FlatMapTransform):
    max_fan_out = None

    def flat_map(self, x: int) -> list[int]:
        return [x] * x


def test_flat_map_transform_without_max_fan_out_on_an_iter_dataset() -> None:
    ds = ex.FlatMapIterDataset(chute.MapDataset.range(5).to_iter_dataset(), _Unbounded())
    assert list(ds) == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4]
    assert_equal_output_after_checkpoint(ds)
    with pytest.raises(ValueError, match=r"max_fan_out = None is invalid: it must be a positive"):
        ex.FlatMapMapDataset(chute.MapDataset.range(5), _Unbounded())
    grain = _grain()

    class G(grain.experimental.FlatMapTransform):  # type: ignore[name-defined]
        max_fan_out = None

        def flat_map(self, x: int) -> list[int]:
            return [x] * x

    gds = grain.experimental.FlatMapIterDataset(grain.MapDataset.range(5).to_iter_dataset(), G())
    assert list(gds) == list(ds)


def test_read_options_threads_with_no_prefetch_buffer() -> None:
    options = chute.ReadOptions(num_threads=4, prefetch_buffer_size=0)
    ds = chute.MapDataset.range(30).shuffle(seed=1).to_iter_dataset(options)
    assert list(ds) == list(chute.MapDataset.range(30).shuffle(seed=1))
    assert_equal_output_after_checkpoint(ds)
    grain = _grain()
    gopts = grain.ReadOptions(num_threads=4, prefetch_buffer_size=0)
    assert list(grain.MapDataset.range(5).to_iter_dataset(gopts)) == [0, 1, 2, 3, 4]


# -- 3. samplers with sharding ---------------------------------------------------------------


def _keys(sampler: Any) -> list[int]:
    return [sampler[i].record_key for i in range(len(sampler))]


@pytest.mark.parametrize("cls", ["IndexSampler", "SequentialSampler"])
@pytest.mark.parametrize(("n", "count", "epochs", "drop"), [(5, 2, 1, False), (10, 3, 2, True)])
def test_sharded_samplers_index_by_global_step_as_grain(
    cls: str, n: int, count: int, epochs: int, drop: bool
) -> None:
    kw: dict[str, Any] = {"shuffle": False, "num_epochs": epochs} if cls == "IndexSampler" else {}
    ours = [
        getattr(chute, cls)(n, chute.sharding.ShardOptions(s, count, drop), **kw)
        for s in range(count)
    ]
    assert ours[0][2].record_key is not None  # a global step, valid on shard 0
    gp = _grain() and pytest.importorskip("grain.python")
    theirs = [getattr(gp, cls)(n, gp.ShardOptions(s, count, drop), **kw) for s in range(count)]
    for a, b in zip(ours, theirs):
        assert len(a) == len(b)
        assert _keys(a) == _keys(b)


def test_index_sampler_gives_each_shard_a_contiguous_range() -> None:
    for shard, expected in [(0, [0, 1, 2, 3]), (1, [4, 5, 6]), (2, [7, 8, 9])]:
        options = chute.sharding.ShardOptions(shard, 3)
        loader = chute.DataLoader(
            data_source=list(range(10)),
            sampler=chute.IndexSampler(10, options, shuffle=True, seed=1, num_epochs=1),
        )
        assert sorted(loader) == expected
        seq = chute.DataLoader(
            data_source=list(range(10)), sampler=chute.SequentialSampler(10, options)
        )
        assert list(seq) == list(range(shard, 10, 3))  # Grain's DataLoader strides


# -- 4. worker processes ---------------------------------------------------------------------


def _two_workers(ds: chute.IterDataset[Any]) -> chute.IterDataset[Any]:
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2))


def test_sys_exit_in_a_worker_is_a_runtime_error_naming_code_and_element() -> None:
    """Grain: the worker process dies, and `next` raises RuntimeError("Worker process was
    terminated unexpectedly with exit code 123 ..."). chute's worker lives on; the
    consumer gets the elements before and a RuntimeError naming the code and element."""
    import sys

    def exits_at_5(x: int) -> int:
        if x == 5:
            sys.exit(123)
        return x

    it = iter(_two_workers(chute.MapDataset.range(10).map(exits_at_5).to_iter_dataset()))
    got = []
    with pytest.raises(RuntimeError, match=r"element at index 5.*exit code 123") as info:
        for x in it:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    assert not isinstance(info.value, SystemExit)

    class ExitsAt5(chute.transforms.MapTransform):
        def map(self, element: int) -> int:
            return exits_at_5(element)

    loader = chute.DataLoader(
        data_source=list(range(10)),
        sampler=chute.SequentialSampler(10),
        operations=[ExitsAt5()],
        worker_count=2,
    )
    with pytest.raises(RuntimeError, match=r"element at index 5.*exit code 123"):
        list(loader)


class _Locked:
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def __call__(self, x: int) -> int:
        return x


def test_unpicklable_transform_raises_the_picklers_own_error_with_chutes_note() -> None:
    """Grain: `TypeError: cannot pickle '_thread.lock' object`, with the note "Dataset:
    MapMapDataset(...) cannot be pickled!". chute raises the same exception, its note
    naming the stage and the fix."""
    ds = _two_workers(chute.MapDataset.range(10).map(_Locked()).to_iter_dataset())
    with pytest.raises(TypeError, match=r"cannot pickle '_thread\.lock' object") as info:
        next(iter(ds))
    assert not isinstance(info.value, chute.multiprocessing.NotPicklableError)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "stage MapMapDataset(transform=" in notes and "cannot be pickled" in notes


def test_a_local_worker_init_fn_is_accepted(tmp_path: Any) -> None:
    """Grain ships `worker_init_fn` to its workers with the dataset; a closure works."""
    marker = tmp_path

    def init(index: int, count: int) -> None:
        (marker / f"{index}-of-{count}").touch()

    ds = chute.MapDataset.range(8).to_iter_dataset()
    out = list(ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2), worker_init_fn=init))
    assert out == list(range(8))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0-of-2", "1-of-2"]


# -- 5. checks Grain makes -------------------------------------------------------------------


def test_user_seeds_of_33_bits_are_rejected_where_grain_rejects_them() -> None:
    """Grain: `shuffle(seed)` and `IndexSampler(seed=)` take seeds in [0, 2**32)."""
    with pytest.raises(ValueError, match=r"shuffle: seed=4294967296 .*\[0, 2\*\*32\)"):
        chute.MapDataset.range(5).shuffle(seed=2**32)
    with pytest.raises(ValueError, match=r"IndexSampler: seed=4294967296 .*\[0, 2\*\*32\)"):
        chute.IndexSampler(5, shuffle=True, seed=2**32)
    assert len(chute.MapDataset.range(5).shuffle(seed=2**32 - 1)) == 5
    # Where Grain takes any int (the pipeline seed, SequentialSampler), so does chute; and
    # the 64-bit seeds chute derives from them restore from a state.
    ds = chute.MapDataset.range(20).seed(2**40).shuffle().to_iter_dataset()
    chute.SequentialSampler(5, seed=2**40)
    assert_equal_output_after_checkpoint(ds)
    g = _grain()
    with pytest.raises(ValueError, match=r"2\*\*32-1"):
        g.MapDataset.range(5).shuffle(seed=2**32)
    with pytest.raises(ValueError, match="32-bit"):
        g.samplers.IndexSampler(5, shuffle=True, seed=2**32)
    assert len(g.MapDataset.range(5).seed(2**40).shuffle()) == 5


def test_repeat_of_an_infinite_dataset_raises_as_grain() -> None:
    """Grain: "Repeating already infinite dataset ... does nothing." (ValueError)."""
    with pytest.raises(ValueError, match="already repeats forever"):
        chute.MapDataset.range(3).repeat().repeat()
    assert len(chute.MapDataset.range(3).repeat(2).repeat(2)) == 12
    g = _grain()
    with pytest.raises(ValueError, match="infinite"):
        g.MapDataset.range(3).repeat().repeat()


def test_rebatch_to_size_0_raises_as_grain() -> None:
    """Grain: `ValueError("batch_size must be positive.")`."""
    batches = chute.MapDataset.range(4).to_iter_dataset().batch(2)
    with pytest.raises(ValueError, match="batch_size=0 is invalid"):
        ex.RebatchIterDataset(batches, batch_size=0)
    g = _grain()
    with pytest.raises(ValueError, match="positive"):
        g.experimental.RebatchIterDataset(
            g.MapDataset.range(4).to_iter_dataset().batch(2), batch_size=0
        )


@pytest.mark.parametrize("where", ["iter", "map", "map_in_workers"])
def test_a_filter_that_drops_everything_warns_as_grain(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Grain checks every 1000 elements a filter tests and, at 90 % dropped or more,
    logs a warning "Transformation ... skipped 100.00 % of the last seen 1000 elements"
    (with absl logging; chute with the "chute" logger). A MapDataset filter is checked
    where `to_iter_dataset` skips what it dropped."""
    ds = chute.MapDataset.range(3000)
    if where == "iter":
        it_ds = ds.to_iter_dataset().filter(lambda x: x < 0)
    else:
        it_ds = ds.filter(lambda x: x < 0).to_iter_dataset()
        if where == "map_in_workers":
            it_ds = it_ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=2))
    caplog.set_level(logging.WARNING, logger="chute")
    assert list(it_ds) == []
    assert re.search(r"skipped 100\.00 % of the last seen \d+ elements", caplog.text)


def test_a_filter_that_keeps_a_fifth_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="chute")
    ds = chute.MapDataset.range(5000).to_iter_dataset().filter(lambda x: x % 5 == 0)
    assert len(list(ds)) == 1000
    assert len(list(chute.MapDataset.range(5000).filter(lambda x: x % 5 == 0))) == 1000
    assert "skipped" not in caplog.text


# -- 6. subclassing, and the thread prefetch ------------------------------------------------


def _subclasses(base: Any) -> tuple[Any, Any]:
    class Doubled(base.MapDataset):
        def __init__(self, parent: Any) -> None:
            super().__init__(parents=parent)  # one dataset, not a list

        def __len__(self) -> int:
            return len(self.parents[0])

        def __getitem__(self, index: Any) -> Any:
            return self.parents[0][index] * 2

    class Passed(base.IterDataset):
        def __init__(self, parent: Any) -> None:
            super().__init__(parents=parent)

        def __iter__(self) -> Any:
            return iter(self.parents[0])

    return Doubled, Passed


@pytest.mark.parametrize("lib", ["chute", "grain"])
def test_a_single_dataset_passed_as_parents(lib: str) -> None:
    """Grain's MapDataset and IterDataset take `parents=ds` as well as a list."""
    base = chute if lib == "chute" else _grain()
    doubled, passed = _subclasses(base)
    ds = doubled(base.MapDataset.range(3))
    assert len(ds.parents) == 1 and list(ds) == [0, 2, 4]
    it_ds = passed(base.MapDataset.range(3).to_iter_dataset())
    assert len(it_ds.parents) == 1 and list(it_ds) == [0, 1, 2]
    assert list(passed(base.MapDataset.range(3))) == [0, 1, 2]


class _Counting(chute.DatasetIterator[int]):
    """A user's iterator (Grain's way: its own state, no `stage` key) that counts what it
    has produced."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.i = n, 0

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def get_state(self) -> dict[str, Any]:
        return {"i": self.i}

    def set_state(self, state: dict[str, Any]) -> None:
        self.i = state["i"]


class _CountingDataset(chute.IterDataset[int]):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.made: list[_Counting] = []

    def __iter__(self) -> chute.DatasetIterator[int]:
        self.made.append(_Counting(self.n))
        return self.made[-1]


@pytest.mark.parametrize("size", [0, 3])
def test_thread_prefetch_over_a_users_iterator_has_the_users_state(size: int) -> None:
    """Grain's ThreadPrefetchIterDataset hands out its parent's state unchanged."""
    ds = ex.ThreadPrefetchIterDataset(_CountingDataset(10), prefetch_buffer_size=size)
    it = iter(ds)
    assert [next(it), next(it)] == [0, 1]
    assert it.get_state() == {"i": 2}
    assert list(it) == list(range(2, 10))
    it.set_state({"i": 2})
    assert list(it) == list(range(2, 10))
    assert_equal_output_after_checkpoint(ds)
    assert_equal_output_after_checkpoint(ds.map(lambda x: x + 1).batch(3))


def _prefetch_threads() -> int:
    import threading

    return sum(t.name == "chute-prefetch" for t in threading.enumerate())


def test_thread_prefetch_reads_ahead_between_calls_with_an_exact_state() -> None:
    """As Grain's: a thread fills the buffer while the consumer does other work; the state
    is the position of the next element the consumer gets, not the thread's."""
    import gc
    import time

    source = _CountingDataset(100)
    ds = ex.ThreadPrefetchIterDataset(source, prefetch_buffer_size=5)
    before = _prefetch_threads()
    it = iter(ds)
    assert next(it) == 0
    deadline = time.monotonic() + 10
    while source.made[-1].i < 7 and time.monotonic() < deadline:
        time.sleep(0.01)  # the consumer is busy; the thread reads on
    time.sleep(0.1)
    assert source.made[-1].i == 7  # 1 handed out, 5 buffered, 1 waiting for room; no more
    assert it.get_state() == {"i": 1}
    assert _prefetch_threads() == before + 1
    it.close()
    assert _prefetch_threads() == before  # close() joins the thread
    it = iter(ds)
    next(it)
    assert _prefetch_threads() == before + 1
    del it
    gc.collect()
    deadline = time.monotonic() + 10
    while _prefetch_threads() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _prefetch_threads() == before  # garbage collection stops it


def test_record_metadata_prints_as_grain() -> None:
    # Grain prints the generator without its address, so printed metadata compare across runs.
    meta = chute.IndexSampler(5, chute.sharding.NoSharding(), shuffle=True, seed=3)[0]
    text = str(meta)
    assert re.fullmatch(r"RecordMetadata\(index=0, record_key=\d, rng=Generator\(Philox\)\)", text)
    grain = _grain()
    theirs = str(
        grain.samplers.IndexSampler(5, grain.sharding.NoSharding(), shuffle=True, seed=3)[0]
    )
    key = re.compile(r"record_key=\d")
    assert key.sub("", text) == key.sub("", theirs), (text, theirs)
