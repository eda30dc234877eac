"""A mixture's weight changes are part of its replayable history (issue 47, defects 1, 5, 8).

Weights given between steps (`set_mix_weights`, after a restore too) are recorded by the
mixture's draw position in its state, so a state restores exactly even where a stage
above replays the mixture from before the change: a window, a prefetch buffer, a cache
read again. A runtime weight of 0 draws nothing from its input while it holds.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import chute
from chute.experimental import (
    FirstFitPackIterDataset,
    WindowShuffleIterDataset,
    set_mix_weights,
)
from chute.testing import assert_trees_equal

N = 4000  # elements per source


def _element(tag: int, i: int) -> dict[str, np.ndarray]:
    """Element `i` of source `tag`: 1 to 5 tokens that name both."""
    return {"t": np.full(1 + i % 5, tag * 1_000_000 + i, dtype=np.int64)}


def _length(x: dict[str, np.ndarray]) -> int:
    return len(x["t"])


def _source(tag: int, n: int = N) -> chute.IterDataset[dict[str, np.ndarray]]:
    return chute.MapDataset.range(n).map(functools.partial(_element, tag)).to_iter_dataset()


def _mix(n: int = N) -> chute.IterDataset[Any]:
    return chute.IterDataset.mix({"a": _source(0, n), "b": _source(1, n)}, {"a": 1.0, "b": 1.0})


def _stage(name: str, ds: chute.IterDataset[Any]) -> chute.IterDataset[Any]:
    """The windowed (or prefetching) stage `name` over `ds`."""
    if name == "batch_by_tokens":
        return ds.batch_by_tokens(24, length_fn=_length, window_size=60, batch_fn=list)
    if name == "bucket_by_sequence_length":
        return ds.bucket_by_sequence_length(
            _length, [3, 5], [4, 4, 4], batch_fn=list, window_size=40
        )
    if name == "window_shuffle":
        return WindowShuffleIterDataset(ds, window_size=50, seed=7)
    if name == "first_fit_pack":
        return FirstFitPackIterDataset(ds, length_struct={"t": 16}, num_packing_bins=4, seed=3)
    assert name == "prefetch"
    return ds.prefetch(4)


STAGES = ["batch_by_tokens", "bucket_by_sequence_length", "window_shuffle", "first_fit_pack"]


def _build(name: str, workers: int) -> chute.IterDataset[Any]:
    ds = _stage(name, _mix())
    if workers:
        ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))
    return ds


def _take(it: Any, n: int) -> list[Any]:
    return [next(it) for _ in range(n)]


def _tokens(xs: list[Any]) -> list[int]:
    """Every token of `xs` (elements, batches of them, or packed rows), in order."""
    out: list[int] = []
    for x in xs:
        if isinstance(x, list):
            out.extend(_tokens(x))
        else:
            out.extend(int(v) for v in np.asarray(x["t"]).ravel() if v)
    return out


def _share_of_b(xs: list[Any]) -> float:
    tokens = _tokens(xs)
    return sum(t >= 1_000_000 for t in tokens) / max(1, len(tokens))


def _resume(
    build: Any, workers: int, into: int, changes: dict[int, dict[str, float]], state_at: int
) -> tuple[list[Any], list[Any]]:
    """The uninterrupted run after step `state_at` (weights changed before the steps in
    `changes`), and the run restored there from its state (through JSON) into a fresh
    pipeline with `into` workers: both 80 steps long (past the windows read then)."""
    it = iter(build(workers))
    try:
        for step in range(state_at):
            if step in changes:
                set_mix_weights(it, changes[step])
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        orig = _take(it, 80)
    finally:
        it.close()
    again = iter(build(into))
    try:
        again.set_state(state)
        resumed = _take(again, 80)
    finally:
        again.close()
    return orig, resumed


def test_the_issues_repro_restores_the_new_weights() -> None:
    a = chute.MapDataset.range(10**6).map(lambda i: ("a", i)).to_iter_dataset()
    b = chute.MapDataset.range(10**6).map(lambda i: ("b", i)).to_iter_dataset()

    def build() -> chute.IterDataset[Any]:
        ds = chute.IterDataset.mix({"a": a, "b": b}, {"a": 1.0, "b": 1.0})
        return ds.batch_by_tokens(
            8, length_fn=lambda x: 1, window_size=100, sort=False, batch_fn=list
        )

    it = iter(build())
    for step in range(7):
        if step == 5:
            set_mix_weights(it, {"a": 1.0, "b": 1000.0})
        next(it)
    state = it.get_state()
    orig = [n for _ in range(100) for n, _ in next(it)]
    again = iter(build())
    again.set_state(state)
    resumed = [n for _ in range(100) for n, _ in next(again)]
    assert orig.count("a") < 50  # the new weights hold
    assert orig == resumed


@pytest.mark.parametrize("name", STAGES)
@pytest.mark.parametrize(("workers", "into"), [(0, 2), (1, 0), (2, 1)])
def test_weights_changed_under_a_windowed_stage_restore_exactly(
    name: str, workers: int, into: int
) -> None:
    changes = {4: {"a": 1.0, "b": 9.0}, 9: {"a": 5.0, "b": 1.0}}
    orig, resumed = _resume(functools.partial(_build, name), workers, into, changes, 12)
    assert_trees_equal(resumed, orig)
    # The last change holds in what follows: a of 5:1 (not the 1:1 built with).
    assert _share_of_b(orig[-10:]) < 0.35


_WEIGHTS = st.fixed_dictionaries(
    {"a": st.sampled_from([0.0, 0.5, 1.0, 3.0]), "b": st.sampled_from([1.0, 2.0, 7.0])}
)


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from([*STAGES, "prefetch"]),
    changes=st.dictionaries(st.integers(0, 24), _WEIGHTS, max_size=4),
    state_at=st.integers(0, 25),
)
def test_any_changes_and_any_state_step_restore_exactly(
    name: str, changes: dict[int, dict[str, float]], state_at: int
) -> None:
    """Weights changed at any steps (0 included), a state at any step: the same rest."""
    orig, resumed = _resume(functools.partial(_build, name), 0, 0, changes, state_at)
    assert_trees_equal(resumed, orig)


@pytest.mark.parametrize(("workers", "into"), [(0, 2), (2, 0)])
def test_weights_changed_behind_prefetch_restore_exactly(workers: int, into: int) -> None:
    changes = {3: {"a": 1.0, "b": 9.0}, 6: {"a": 1.0, "b": 0.0}}
    for _ in range(3):  # the change lands where the prefetch thread is: several timings
        orig, resumed = _resume(functools.partial(_build, "prefetch"), workers, into, changes, 10)
        assert_trees_equal(resumed, orig)
        assert _share_of_b(orig[-5:]) == 0  # b switched off


@pytest.mark.parametrize("name", [*STAGES, "prefetch"])
def test_weights_given_at_restore_are_replayed_too(name: str) -> None:
    """set_state, then new weights: a later state under the window restores them."""
    it = iter(_build(name, 0))
    _take(it, 5)
    first = it.get_state()
    it.close()
    resumed = iter(_build(name, 0))
    resumed.set_state(first)
    set_mix_weights(resumed, {"a": 0.0, "b": 1.0})  # given at restore: b only
    _take(resumed, 6)
    state = json.loads(json.dumps(resumed.get_state()))
    orig = _take(resumed, 60)
    resumed.close()
    again = iter(_build(name, 1))
    try:
        again.set_state(state)
        assert_trees_equal(_take(again, 60), orig)
    finally:
        again.close()
    assert _share_of_b(orig[-5:]) == 1.0


@pytest.mark.parametrize("path", [False, True])
@pytest.mark.parametrize(("workers", "into"), [(0, 0), (0, 2), (1, 0)])
def test_cache_repeat_over_changed_weights_replays_the_first_pass(
    path: bool, workers: int, into: int, tmp_path: Any
) -> None:
    """Issue 47 defect 8: the second epoch of a restored run is the first pass as it was,
    weights changes included, as the uninterrupted run's cache replays it."""

    runs = iter(range(2))  # a disk cache of its own for each run: none is complete

    def build(w: int) -> chute.IterDataset[Any]:
        mixed = _mix(150)
        cached = mixed.cache(str(tmp_path / f"cache{next(runs)}")) if path else mixed.cache()
        ds = cached.repeat(2).batch(5, batch_fn=list)
        if w:
            ds = ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=w))
        return ds

    it = iter(build(workers))
    try:
        for step in range(12):
            if step == 4:
                set_mix_weights(it, {"a": 1.0, "b": 4.0})
            next(it)
        state = json.loads(json.dumps(it.get_state()))
        orig = list(it)
    finally:
        it.close()
    assert len(orig) > 40  # the rest of the first pass (27 batches) and the second
    again = iter(build(into))
    try:
        again.set_state(state)
        resumed = list(again)
    finally:
        again.close()
    assert_trees_equal(resumed, orig)


def test_repeat_replays_the_changes_of_each_epoch() -> None:
    """A repeat above the mixture starts each epoch from the mixture's start and makes the
    changes again where they were made: every epoch is the same."""
    ds = _mix(60).repeat(3)
    it = iter(ds)
    head = _take(it, 10)
    set_mix_weights(it, {"a": 1.0, "b": 3.0})
    rest = list(it)
    out = head + rest
    epoch = len(out) // 3
    assert_trees_equal(out[epoch : 2 * epoch], out[:epoch])
    assert_trees_equal(out[2 * epoch :], out[:epoch])


# -- a runtime weight of 0 ------------------------------------------------------------------


def _tags(xs: list[Any]) -> list[int]:
    return [int(x["t"][0]) // 1_000_000 for x in xs]


def test_a_weight_of_0_draws_nothing_from_its_input_and_restores() -> None:
    ds = chute.IterDataset.mix([_source(0), _source(1), _source(2)], [1, 1, 1])
    it = iter(ds)
    _take(it, 9)
    set_mix_weights(it, [2, 0, 1])
    state = json.loads(json.dumps(it.get_state()))
    assert state["weights"] == [2.0, 0.0, 1.0]
    after = _take(it, 30)
    assert _tags(after) == [0, 0, 2] * 10  # input 1 is switched off
    batch = it._next_many(30)  # the batched path draws the same way
    assert _tags(batch) == [0, 0, 2] * 10
    fresh = iter(ds)
    fresh.set_state(state)
    assert_trees_equal(_take(fresh, 60), after + batch)
    set_mix_weights(it, [1, 1, 1])  # back on: input 1 continues where it was
    back = _take(it, 3)
    # Back on, input 1 continues where it was (3 of its elements were drawn before).
    assert [int(x["t"][0]) for x in back if _tags([x]) == [1]] == [1_000_003]


def test_a_weight_of_0_from_a_function_of_the_step() -> None:
    def weights(step: int) -> list[float]:
        return [1.0, 0.0] if step % 2 else [0.0, 1.0]

    ds = chute.IterDataset.mix([_source(0, 50), _source(1, 50)], weights, step_size=4)
    out = list(ds)
    assert _tags(out[:12]) == [1] * 4 + [0] * 4 + [1] * 4
    again = iter(ds)
    _take(again, 6)
    state = json.loads(json.dumps(again.get_state()))
    fresh = iter(ds)
    fresh.set_state(state)
    assert_trees_equal(list(fresh), out[6:])


def test_a_short_input_at_weight_0_does_not_end_the_mixture() -> None:
    ds = chute.IterDataset.mix([_source(0, 3), _source(1, 100)], [1, 1])
    it = iter(ds)
    _take(it, 2)
    set_mix_weights(it, [0, 1])
    rest = list(it)
    assert len(rest) == 99 and set(_tags(rest)) == {1}


def test_weights_of_0_errors_name_the_rule_and_the_fix() -> None:
    it = iter(chute.IterDataset.mix({"a": _source(0), "b": _source(1)}, {"a": 1, "b": 1}))
    with pytest.raises(ValueError, match=r"at least one weight must be positive .* give at least"):
        set_mix_weights(it, {"a": 0, "b": 0.0})
    with pytest.raises(ValueError, match=r"weight -0.5 is invalid: weights must be numbers >= 0"):
        set_mix_weights(it, {"a": -0.5, "b": 1})
    # Built with 0 is refused, as Grain's mixtures refuse it; the message names set_weights.
    with pytest.raises(
        ValueError, match=r"weight 0 is invalid: .* switch it off at run time with set_weights"
    ):
        chute.IterDataset.mix([_source(0), _source(1)], [1, 0])
    with pytest.raises(ValueError, match="weight 0 is invalid"):
        chute.MapDataset.mix([chute.MapDataset.range(3), chute.MapDataset.range(3)], [0, 1])
    with pytest.raises(ValueError, match=r"weights\(0\) returned \[1, 0\]: weight 0 is invalid"):
        chute.MapDataset.mix(
            [chute.MapDataset.range(3), chute.MapDataset.range(3)], lambda step: [1, 0]
        )[0]
    bad = chute.IterDataset.mix([_source(0), _source(1)], lambda step: [0, 0])
    with pytest.raises(ValueError, match=r"weights\(0\) returned \[0, 0\]"):
        next(iter(bad))


# -- the schedule in the state ------------------------------------------------------------


def test_the_state_records_each_change_by_position() -> None:
    ds = _mix().batch_by_tokens(24, length_fn=_length, window_size=60, batch_fn=list)
    it = iter(ds)
    plain = it.get_state()
    assert "changes" not in plain["parent"]  # no change, no schedule: the state of before
    next(it)
    set_mix_weights(it, {"a": 1.0, "b": 3.0})
    next(it)  # from what the window read before: the mixture is where it was
    set_mix_weights(it, {"a": 1.0, "b": 2.0})  # so this call replaces the one before
    assert len(it.get_state()["parent"]["changes"]) == 1
    _take(it, 20)
    set_mix_weights(it, {"a": 2.0, "b": 1.0})
    state = it.get_state()
    mix = state["parent"]
    positions = [p for p, _ in mix["changes"]]
    assert positions == sorted(positions) and len(positions) == 2
    assert [w for _, w in mix["changes"]] == [{"a": 1.0, "b": 2.0}, {"a": 2.0, "b": 1.0}]
    assert mix["weights"] == {"a": 1.0, "b": 2.0}  # in force where the window starts
    assert positions[0] <= mix["index"] < positions[1]  # the window starts between them
    # The held state was brought up to date, never changed in place.
    assert it.get_state() == state
    # A state edited into a schedule out of order is refused, naming the path.
    bad = json.loads(json.dumps(state))
    bad.pop("checksum")
    bad["parent"]["changes"].reverse()
    with pytest.raises(chute.CheckpointError, match=r"\['changes'\]\[1\]\[0\] = \d+ is invalid"):
        iter(ds).set_state(bad)


def test_the_schedule_is_bounded_and_says_so() -> None:
    from chute._src.ops.mix_schedule import MAX_CHANGES

    ds = _mix(3 * MAX_CHANGES).repeat(2)
    it = iter(ds)
    for k in range(MAX_CHANGES + 5):
        set_mix_weights(it, {"a": 1.0 + k % 2, "b": 1.0})
        next(it)
    state = it.get_state()
    assert len(state["parent"]["changes"]) == MAX_CHANGES
    # The epoch's end replays from position 0, before the oldest change kept: an error
    # that says why and what to do, never other weights.
    with pytest.raises(ValueError, match=rf"keeps the last {MAX_CHANGES} changes.*less often"):
        list(it)
    too_long = json.loads(json.dumps(state))
    too_long.pop("checksum")
    too_long["parent"]["changes"].append([10**9, {"a": 1.0, "b": 1.0}])
    with pytest.raises(chute.CheckpointError, match=rf"a list of 1 to {MAX_CHANGES} changes"):
        iter(ds).set_state(too_long)


def test_a_refused_state_leaves_the_schedule_as_it_was() -> None:
    """A `set_state` that fails after the mixture was restored returns the pipeline to
    where it was, its schedule of changes included."""

    def build() -> chute.IterDataset[Any]:
        return _stage("batch_by_tokens", _mix())

    runs = []
    for refuse in (False, True):
        it = iter(build())
        for step in range(12):
            if step == 5:
                set_mix_weights(it, {"a": 1.0, "b": 9.0})
            next(it)
        if refuse:
            bad = it.get_state()
            bad.pop("checksum")
            bad["window"] += 3  # found wrong only after the mixture was restored
            with pytest.raises(chute.CheckpointError, match=r"state\['window'\]"):
                it.set_state(bad)
        runs.append(_take(it, 80))
    assert_trees_equal(runs[1], runs[0])
    assert _share_of_b(runs[0][-10:]) > 0.7
