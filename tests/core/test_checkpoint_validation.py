"""Every integer of a checkpoint is checked against what its stage can hold.

For every stateful stage: a real state taken mid-stream, each integer corrupted (huge,
negative, one past the largest valid value, a float, a bool, a string) must raise
`CheckpointError` naming its path and leave the iterator where it was; real states at the
boundaries restore exactly.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chute
from chute import experimental as ex
from chute.testing import assert_equal_output_after_checkpoint

# -- pipelines, one per stateful stage ----------------------------------------------------


class Parts(ex.FlatMapTransform):
    max_fan_out = 4

    def flat_map(self, element: int) -> list[int]:
        return [element] * (element % 4)


def _seqs(n: int = 40) -> chute.IterDataset[Any]:
    lengths = [1 + (7 * i) % 9 for i in range(n)]
    return chute.MapDataset.source(
        [{"t": np.arange(k, dtype=np.int32) + i} for i, k in enumerate(lengths)]
    ).to_iter_dataset()


def _jsonl(tmp: Path) -> str:
    path = tmp / "lines.jsonl"
    path.write_text("".join(f'{{"a": {i}}}\n' for i in range(30)))
    return str(path)


PIPELINES: dict[str, Callable[[Path], chute.IterDataset[Any]]] = {
    "to_iter_dataset": lambda _: chute.MapDataset.range(30).to_iter_dataset(),
    "map_with_index": lambda _: (
        chute.MapDataset.range(30).to_iter_dataset().map_with_index(lambda i, x: (i, x))
    ),
    "limit": lambda _: chute.MapDataset.range(30).to_iter_dataset().limit(20),
    "repeat": lambda _: chute.MapDataset.range(7).to_iter_dataset().repeat(3),
    "mix": lambda _: chute.IterDataset.mix(
        [
            chute.MapDataset.range(30).to_iter_dataset(),
            chute.MapDataset.range(100, 140).to_iter_dataset(),
        ],
        [2, 1],
    ),
    "mix_dict": lambda _: chute.IterDataset.mix(
        {
            "a": chute.MapDataset.range(30).to_iter_dataset(),
            "b": chute.MapDataset.range(100, 140).to_iter_dataset(),
        },
    ),
    "first_fit": lambda _: ex.FirstFitPackIterDataset(
        _seqs(), length_struct={"t": 12}, num_packing_bins=3
    ),
    "best_fit_split": lambda _: ex.BestFitPackIterDataset(
        _seqs(), length_struct={"t": 5}, num_packing_bins=2, split_long_sequences=True
    ),
    "concat_split": lambda _: ex.ConcatThenSplitIterDataset(_seqs(), length_struct={"t": 6}),
    "rebatch": lambda _: ex.RebatchIterDataset(
        chute.MapDataset.range(40).to_iter_dataset().batch(7), 3
    ),
    "window_shuffle": lambda _: ex.WindowShuffleIterDataset(
        chute.MapDataset.range(30).to_iter_dataset(), window_size=8, seed=3
    ),
    "interleave": lambda _: ex.InterleaveIterDataset(
        [chute.MapDataset.range(10 * i, 10 * i + 7) for i in range(4)],
        cycle_length=2,
        iter_buffer_size=3,
    ),
    "flat_map": lambda _: ex.FlatMapIterDataset(
        chute.MapDataset.range(30).to_iter_dataset(), Parts()
    ),
    "cache": lambda _: chute.MapDataset.range(9).to_iter_dataset().cache().repeat(3),
    "disk_cache": lambda tmp: (
        chute.MapDataset.range(9).to_iter_dataset().cache(tmp / "cache").repeat(2)
    ),
    "file_lines": lambda tmp: ex.JsonlIterDataset(_jsonl(tmp)),
}


def _take(it: Iterator[Any], n: int) -> list[Any]:
    return list(itertools.islice(it, n))


def _same(a: list[Any], b: list[Any]) -> None:
    chute.testing.assert_trees_equal(a, b)


def _int_leaves(state: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(state, dict):
        for k, v in state.items():
            yield from _int_leaves(v, (*path, k))
    elif isinstance(state, list):
        for i, v in enumerate(state):
            yield from _int_leaves(v, (*path, i))
    elif isinstance(state, int) and not isinstance(state, bool):
        yield path


def _set(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(state)
    node: Any = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


def _get(state: dict[str, Any], path: tuple[Any, ...]) -> Any:
    node: Any = state
    for k in path:
        node = node[k]
    return node


def _path_text(path: tuple[Any, ...]) -> str:
    """The path an error names: a list of ints (a remainder) is named as a whole."""
    while path and isinstance(path[-1], int):
        path = path[:-1]
    return "state" + "".join(f"[{k!r}]" for k in path)


def _mid_state(ds: chute.IterDataset[Any], k: int) -> tuple[Any, dict[str, Any]]:
    """The state after `k` elements, without its checksum: the values themselves are
    checked, as for a state a user edited and unsealed on purpose (any edit of a state
    with its checksum is rejected as changed, test_checkpoint_tamper.py)."""
    it = iter(ds)
    _take(it, k)
    state = json.loads(json.dumps(it.get_state()))
    del state["checksum"]
    return it, state


# -- every integer, corrupted --------------------------------------------------------------

CORRUPT = [2**62, -1, 1.0, True, "3"]


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_integer_is_checked(name: str, tmp_path: Path) -> None:
    ds = PIPELINES[name](tmp_path)
    it, state = _mid_state(ds, 11)
    check = iter(ds)
    check.set_state(state)
    expected = _take(check, 15)
    leaves = list(_int_leaves(state))
    assert leaves
    for path in leaves:
        for bad in CORRUPT:
            with pytest.raises(chute.CheckpointError, match=re.escape(_path_text(path))):
                it.set_state(_set(state, path, bad))
    # Every rejected state left the iterator where it was.
    _same(_take(it, 15), expected)
    it.close()
    check.close()


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_real_states_restore_exactly(name: str, tmp_path: Path) -> None:
    # Every step, so every boundary a real state reaches (a full window, the last row of a
    # batch of bins, the end of the stream) is restored.
    assert_equal_output_after_checkpoint(PIPELINES[name](tmp_path), max_elements=80)


# -- one past the largest valid value ------------------------------------------------------

# (pipeline, elements taken, path, new value, words of the rule in the message)
ONE_PAST = [
    ("to_iter_dataset", 5, ("next_index",), 31, r"\[0, 30\]"),
    ("limit", 5, ("taken",), 21, r"\[0, 20\]"),
    ("limit", 5, ("taken",), 6, "handed out 5"),
    ("map_with_index", 5, ("index",), 6, "handed out 5"),
    ("repeat", 3, ("epoch",), 4, r"\[0, 3\]"),
    ("repeat", 3, ("in_epoch",), 4, "3 elements into it"),
    ("mix", 4, ("index",), 5, "handed out"),
    ("mix_dict", 4, ("index",), 5, "inputs did"),
    ("first_fit", 1, ("emitted",), 3, "num_packing_bins=3"),
    ("first_fit", 1, ("skip",), 256, "chunk"),
    ("first_fit", 1, ("piece",), 1, "does not split"),
    ("first_fit", 4, ("counter",), None, "elements read before it"),
    ("best_fit_split", 3, ("emitted",), 2, "num_packing_bins=2"),
    ("window_shuffle", 3, ("piece",), 8, "window_size=8"),
    ("window_shuffle", 3, ("window",), 1, "begins at element 8"),
    ("window_shuffle", 10, ("window",), 0, "begins at element 0"),
    ("concat_split", 2, ("emitted",), 3, r"\[0, 2\]"),
    ("flat_map", 2, ("piece",), 4, "max_fan_out=4"),
    ("interleave", 3, ("cycle_pos",), 2, "cycle_length=2"),
    ("interleave", 3, ("next_input",), 5, "4 inputs"),
    ("interleave", 3, ("slots", 0, "skip"), 4, "iter_buffer_size=3"),
    ("interleave", 3, ("slots", 0, "input"), 2, "already opened"),
    ("interleave", 3, ("slots", 1, "input"), 0, "also in slot 0"),
    ("file_lines", 3, ("slots", 0, "parent", "offset"), None, "not the start of a line"),
    ("file_lines", 3, ("next_input",), 2, "of the 1 inputs to open"),
]


@pytest.mark.parametrize(("name", "k", "path", "value", "rule"), ONE_PAST)
def test_one_past_the_largest_valid_value(
    name: str, k: int, path: tuple[Any, ...], value: Any, rule: str, tmp_path: Path
) -> None:
    ds = PIPELINES[name](tmp_path)
    it, state = _mid_state(ds, k)
    if value is None:
        value = _get(state, path) + 1
        if name == "first_fit":  # the most rows that can come before: one per element read
            value = _get(state, ("parent", "next_index")) + state["skip"] + 1
    expected = _take(iter(ds), k + 10)[k:]
    with pytest.raises(chute.CheckpointError, match=re.escape(_path_text(path)) + ".*" + rule):
        it.set_state(_set(state, path, value))
    _same(_take(it, 10), expected)


@pytest.mark.parametrize(
    ("name", "k", "path", "value", "rule"),
    [
        ("rebatch", 1, ("piece",), 7, "the input batch there has 7 rows"),
        ("window_shuffle", 26, ("piece",), 7, "the window there has 6 elements"),
        ("best_fit_split", 1, ("piece",), 9, "splits into"),
        ("flat_map", 2, ("piece",), 3, "the element there has"),
        ("concat_split", 2, ("remainder", 0), 99, "features end at"),
        ("cache", 12, ("parent", "position"), 10, "cached has 9"),
    ],
)
def test_values_found_wrong_by_replaying_leave_the_iterator_as_it_was(
    name: str, k: int, path: tuple[Any, ...], value: Any, rule: str, tmp_path: Path
) -> None:
    ds = PIPELINES[name](tmp_path)
    it, state = _mid_state(ds, k)
    expected = _take(iter(ds), k + 10)[k:]
    with pytest.raises(chute.CheckpointError, match=re.escape(_path_text(path)) + ".*" + rule):
        it.set_state(_set(state, path, value))
    _same(_take(it, 10), expected)


@pytest.mark.parametrize("skip", [10**8, 2**62])
def test_huge_skip_on_an_infinite_stream_is_rejected_before_any_replay(skip: int) -> None:
    ds = ex.FirstFitPackIterDataset(
        chute.MapDataset.source([{"t": np.arange(3)}]).repeat().to_iter_dataset(),
        length_struct={"t": 8},
        num_packing_bins=2,
    )
    it, state = _mid_state(ds, 2)
    for key in ("skip", "counter", "emitted", "piece"):
        with pytest.raises(chute.CheckpointError, match=re.escape(f"state[{key!r}]")):
            it.set_state({**state, key: skip})
    with pytest.raises(chute.CheckpointError, match=r"state\['parent'\]\['next_index'\]"):
        it.set_state({**state, "parent": {**state["parent"], "next_index": 2**62}})


@pytest.mark.parametrize("fetched", [300, 10**8])
def test_more_read_ahead_than_a_reader_holds_is_rejected(fetched: int) -> None:
    """A stage's reader holds at most one chunk read ahead of the stage (`"fetched"`
    counts from the state's upstream mark): a state saying more is rejected, and the
    iterator stays where it was, rather than reading that far."""
    ds = ex.FirstFitPackIterDataset(
        chute.MapDataset.source([{"t": np.arange(3)}]).repeat().to_iter_dataset(),
        length_struct={"t": 8},
        num_packing_bins=2,
    )
    it, state = _mid_state(ds, 2)
    expected = _take(iter(ds), 12)[2:]
    with pytest.raises(chute.CheckpointError, match=r"state\['fetched'\].*at most 256"):
        it.set_state({**state, "fetched": fetched})
    _same(_take(it, 10), expected)


@pytest.mark.parametrize(
    "name", ["first_fit", "best_fit_split", "concat_split", "rebatch", "window_shuffle", "flat_map"]
)
def test_a_state_without_the_read_ahead_restores(name: str, tmp_path: Path) -> None:
    """A state from before stages recorded how far their reader had read ("fetched",
    "chunk") still restores the same elements."""
    ds = PIPELINES[name](tmp_path)
    _, state = _mid_state(ds, 3)
    assert {"fetched", "chunk"} <= set(state)
    old = {k: v for k, v in state.items() if k not in ("fetched", "chunk")}
    fresh = iter(ds)
    fresh.set_state(old)
    _same(_take(fresh, 10), _take(iter(ds), 13)[3:])


def test_error_names_the_value_the_rule_and_the_fix() -> None:
    it, state = _mid_state(PIPELINES["first_fit"](Path()), 1)
    with pytest.raises(chute.CheckpointError) as info:
        it.set_state({**state, "counter": 2**62})
    message = str(info.value)
    assert "state['counter'] = 4611686018427387904 is invalid" in message
    assert "restore a state taken by get_state()" in message


# -- any integer mutation: a CheckpointError or a working iterator -----------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(n for n in PIPELINES if n not in ("disk_cache", "file_lines"))),
    k=st.integers(0, 25),
    pick=st.integers(0, 1000),
    delta=st.one_of(st.integers(-3, 3), st.integers(-(2**64), 2**64)),
)
def test_any_integer_mutation_is_rejected_or_restores(
    name: str, k: int, pick: int, delta: int
) -> None:
    ds = PIPELINES[name](Path())
    it, state = _mid_state(ds, k)
    leaves = list(_int_leaves(state))
    path = leaves[pick % len(leaves)]
    mutated = _set(state, path, _get(state, path) + delta)
    try:
        it.set_state(mutated)
    except chute.CheckpointError:
        return
    _take(it, 40)  # any exception other than CheckpointError fails the property
    it.close()
