"""IterDataset.source: iterables and factories resume by counting, stateful objects (an
HF-style streaming dataset) resume exactly from their own state."""

from __future__ import annotations

import json
from typing import Any

import pytest

import chute
import shard_helpers as sh
from chute.testing import assert_equal_output_after_checkpoint


def test_a_list_and_a_factory_resume_by_counting() -> None:
    ds = chute.IterDataset.source([3, 1, 4, 1, 5, 9, 2, 6]).map(lambda x: x * 2).batch(3)
    assert [b.tolist() for b in ds] == [[6, 2, 8], [2, 10, 18], [4, 12]]
    assert_equal_output_after_checkpoint(ds)
    made = chute.IterDataset.source(sh.Rows(7, 12))
    it = iter(made)
    assert [next(it)["row"] for _ in range(5)] == [0, 1, 2, 3, 4]
    state = it.get_state()
    del state["checksum"]
    assert state == {"stage": "source", "count": 5}
    assert_equal_output_after_checkpoint(made)


def test_hf_like_streaming_dataset_resumes_from_its_own_state() -> None:
    corpus = sh.StreamingCorpus([["a", "b", "c"], ["d"], ["e", "f"]])
    ds = chute.IterDataset.source(corpus).map(lambda x: x["text"].upper())
    it = iter(ds)
    assert [next(it) for _ in range(4)] == ["A", "B", "C", "D"]
    state = json.loads(json.dumps(it.get_state()))
    del state["checksum"]
    assert state == {"stage": "map", "parent": {"stage": "source", "state": {"shard": 1, "row": 1}}}
    assert list(it) == ["E", "F"]
    fresh = iter(ds)
    fresh.set_state(state)  # no element before the state is read again
    assert list(fresh) == ["E", "F"]
    assert_equal_output_after_checkpoint(ds)


def test_the_counting_restore_checks_the_source_still_has_the_elements() -> None:
    it = iter(chute.IterDataset.source(sh.Rows(0, 3)))
    with pytest.raises(chute.CheckpointError, match=r"\['count'\] = 5 is past the end of"):
        it.set_state({"stage": "source", "count": 5})
    assert next(it) == {"shard": 0, "row": 0}  # the iterator is where it was


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (iter([1, 2]), "is an iterator, which can be read only once.*pass the function"),
        ((x for x in range(3)), "is an iterator, which can be read only once"),
        (42, "is neither iterable, nor a function returning an iterator"),
        ("text", "is not a stream of elements .*characters"),
        ({"a": 1}, "is not a stream of elements"),
    ],
)
def test_things_that_are_not_sources_are_refused(value: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        chute.IterDataset.source(value)


def test_a_factory_that_returns_no_iterator_is_named() -> None:
    not_a_factory: Any = lambda: 5  # noqa: E731
    ds = chute.IterDataset.source(not_a_factory)
    with pytest.raises(TypeError, match="returned 5 of type int, which is not iterable"):
        list(ds)
