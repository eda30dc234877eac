"""`Columns`: chunks of one structure of same-shaped arrays, one array per leaf. Rows and
batches made from them are what the elements and `tree.stack` give; anything else stays
a list."""

from __future__ import annotations

import pickle
from collections import OrderedDict, defaultdict
from typing import Any

import numpy as np
import pytest

from chute._src.core import tree
from chute._src.core.columns import Columns, columns_of
from mp_pipelines import assert_exactly_equal, uniform


def element(i: int) -> dict[str, Any]:
    return {**uniform(i), "tuple": (np.array([i], "<i8"),)}


def test_rows_are_the_elements_and_stacking_is_tree_stack() -> None:
    items = [element(i) for i in range(10)]
    cols = columns_of(items)
    assert isinstance(cols, Columns) and len(cols) == 10 and len(cols.leaves) == 5
    for i in range(10):
        assert_exactly_equal(cols[i], items[i])
    assert_exactly_equal(cols[3:7][0], items[3])
    assert len(cols[::3]) == 4
    assert_exactly_equal(cols.stacked(), tree.stack(items))
    # A 0-d leaf comes back a 0-d array, not a numpy scalar.
    assert type(cols[4]["pair"].right) is np.ndarray and cols[4]["pair"].right.shape == ()


def test_take_and_join_cut_and_concatenate_like_stacking_the_rows() -> None:
    items = [element(i) for i in range(12)]
    a = columns_of(items[:5])
    b = columns_of(items[5:])
    assert a is not None and b is not None
    joined = Columns.join([a.take(2, 5), b.take(0, 4)])
    assert len(joined) == 7
    assert_exactly_equal(joined.stacked(), tree.stack(items[2:9]))
    assert Columns.join([a]) is a and a.take(0, 5) is a


def test_a_batch_owns_its_memory() -> None:
    cols = columns_of([element(i) for i in range(8)])
    assert cols is not None
    part = cols.take(2, 6).stacked()
    assert not np.shares_memory(part["ids"], cols.leaves[0])
    part["ids"][:] = -1  # a batch is the user's to write
    assert (cols[2]["ids"] == 2).all()


def test_pickling_keeps_the_columns() -> None:
    cols = columns_of([element(i) for i in range(4)])
    assert cols is not None
    back = pickle.loads(pickle.dumps(cols, protocol=5))
    assert isinstance(back, Columns)
    assert_exactly_equal(back.stacked(), cols.stacked())
    assert back.nbytes == cols.nbytes


def test_bare_arrays_make_columns() -> None:
    items = [np.full((3, 4), i, np.float64) for i in range(5)]
    cols = columns_of(items)
    assert cols is not None
    np.testing.assert_array_equal(cols.stacked(), np.stack(items))
    np.testing.assert_array_equal(cols[2], items[2])


@pytest.mark.parametrize(
    ("items", "why"),
    [
        ([{"x": np.zeros(3)}], "one element"),
        ([{"x": np.zeros(3)}, None], "a filtered element"),
        ([{"x": np.zeros(3)}, {"x": np.zeros(4)}], "ragged"),
        ([{"x": np.zeros(3)}, {"x": np.zeros(3, np.float32)}], "dtypes differ"),
        ([{"x": np.zeros(3)}, {"y": np.zeros(3)}], "keys differ"),
        ([{"x": np.zeros(1), "y": np.zeros(1)}, {"y": np.zeros(1), "x": np.zeros(1)}], "order"),
        ([{"x": np.zeros(3), "s": "a"}, {"x": np.zeros(3), "s": "b"}], "a string leaf"),
        ([{"x": 1}, {"x": 2}], "a Python scalar"),
        ([{"x": np.float32(1)}, {"x": np.float32(2)}], "a numpy scalar"),
        ([np.array([None]), np.array([None])], "objects"),
        ([np.zeros(2, ">i4"), np.zeros(2, ">i4")], "big-endian: stacking would swap bytes"),
        ([np.ma.zeros(3), np.ma.zeros(3)], "an array subclass"),
        ([OrderedDict(x=np.zeros(1)), OrderedDict(x=np.zeros(1))], "a dict subclass"),
        ([defaultdict(None, x=np.zeros(1)), defaultdict(None, x=np.zeros(1))], "defaultdict"),
        ([{}, {}], "no leaves"),
        ([[np.zeros(1)], (np.zeros(1),)], "list and tuple"),
        ([{"x": np.zeros(2)}, {"x": np.ma.zeros(2)}], "a later array subclass"),
        ([{"x": np.zeros(2, "<i4")}, {"x": np.zeros(2, ">i4")}], "a later big-endian leaf"),
        ([{"x": np.zeros(2)}, {"x": np.array([None, 1])}], "a later object array"),
        ([{"x": np.zeros(2)}, OrderedDict(x=np.zeros(2))], "a later dict subclass"),
        ([{"x": np.zeros(2)}, {"x": {"y": np.zeros(2)}}], "a later nested dict"),
        ([{"x": np.zeros(2)}, {"x": np.zeros(2), "y": np.zeros(2)}], "a later extra key"),
    ],
)
def test_anything_else_stays_a_list(items: list[Any], why: str) -> None:
    assert columns_of(items) is None, why


def test_a_dict_of_batch_arrays_as_columns() -> None:
    arrays = {"t": np.arange(12, dtype=np.int32).reshape(4, 3), "w": np.ones((4, 3), np.float32)}
    cols = Columns.of_dict(arrays)
    assert cols is not None and len(cols) == 4
    assert_exactly_equal(cols[2], {"t": arrays["t"][2], "w": arrays["w"][2]})
    assert_exactly_equal(cols.take(1, 3).stacked(), {k: v[1:3] for k, v in arrays.items()})
    assert Columns.of_dict({"meta": np.empty(4, dtype=object)}) is None
    assert Columns.of_dict({}) is None
