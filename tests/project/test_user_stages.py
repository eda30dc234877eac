"""User-written stages, through the public protocol only (docs/extending.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import chute
from chute.testing import assert_equal_output_after_checkpoint

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def test_the_examples_of_extending_md_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5
    namespace: dict[str, Any] = {"__name__": "extending_md"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)


class Counter(chute.DatasetIterator[int]):
    """Grain-style: a state of its own shape, no parent."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self._n, self._i = n, 0

    def __next__(self) -> int:
        if self._i >= self._n:
            raise StopIteration
        self._i += 1
        return self._i - 1

    def get_state(self) -> dict[str, Any]:
        return {"position": [self._i]}  # any shape

    def set_state(self, state: dict[str, Any]) -> None:
        (self._i,) = state["position"]


class Counting(chute.IterDataset[int]):
    def __init__(self, n: int) -> None:
        super().__init__()
        self._n = n

    def __iter__(self) -> Counter:
        return Counter(self._n)


def test_user_stream_under_map_and_batch_restores() -> None:
    ds = Counting(23).map(lambda x: x * 2).filter(lambda x: x % 3).batch(4)
    it = iter(ds)
    first = next(it).tolist()
    state = it.get_state()
    rest = [b.tolist() for b in it]
    again = iter(ds)
    again.set_state(state)
    assert [b.tolist() for b in again] == rest
    assert first == [2, 4, 8, 10]
    assert_equal_output_after_checkpoint(ds)


def test_user_stream_state_sits_where_its_stage_is() -> None:
    it = iter(Counting(5).map(lambda x: x).batch(2))
    next(it)
    state = it.get_state()
    del state["checksum"]
    assert state == {
        "stage": "batch",
        "params": "batch_size=2, drop_remainder=False",
        "parent": {"stage": "map", "parent": {"position": [2]}},
    }


def test_a_state_the_user_stage_rejects_names_the_path() -> None:
    class Strict(Counter):
        def set_state(self, state: dict[str, Any]) -> None:
            if "position" not in state:
                raise chute.CheckpointError(f"no position in {state!r}")
            super().set_state(state)

    class StrictDs(Counting):
        def __iter__(self) -> Counter:
            return Strict(self._n)

    it = iter(StrictDs(5).map(lambda x: x))
    next(it)
    with pytest.raises(chute.CheckpointError, match="no position") as e:
        it.set_state({"stage": "map", "parent": {"oops": 1}})
    assert "state['parent']" in "\n".join(getattr(e.value, "__notes__", []))
    assert list(it) == [1, 2, 3, 4]  # where it was


@pytest.mark.parametrize("workers", [0, 2])
def test_user_streams_inside_interleave_and_mix_with_workers(workers: int) -> None:
    def build(w: int) -> chute.IterDataset[Any]:
        files = chute.experimental.InterleaveIterDataset(
            [Counting(4), chute.MapDataset.range(10, 16), Counting(3)], cycle_length=2
        )
        mixed = chute.IterDataset.mix([files, chute.MapDataset.range(100, 130).to_iter_dataset()])
        return mixed.map(lambda x: x + 1).mp_prefetch(chute.MultiprocessingOptions(num_workers=w))

    expected = list(build(0))
    assert list(build(workers)) == expected
    # Inputs of different kinds have states of different shapes: the slots' shape changes.
    assert_equal_output_after_checkpoint(build(workers), restore_into=build(0), same_shape=False)


class Parented(chute.DatasetIterator[int]):
    """Grain-style with a parent: `super().__init__(parent)`, the parent's state inside."""

    def __init__(self, parent: chute.DatasetIterator[int]) -> None:
        super().__init__(parent)
        self._up = parent
        self._seen = 0

    def __next__(self) -> int:
        x = next(self._up)
        self._seen += 1
        return x * 100 + self._seen

    def get_state(self) -> dict[str, Any]:
        return {"seen": self._seen, "up": self._up.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self._up.set_state(state["up"])
        self._seen = state["seen"]


class ParentedDs(chute.IterDataset[int]):
    def __init__(self, parent: chute.IterDataset[int]) -> None:
        super().__init__([parent])

    def __iter__(self) -> Parented:
        return Parented(iter(self.parents[0]))  # type: ignore[call-overload]


def test_user_stage_with_a_parent_gets_the_shared_lifecycle() -> None:
    src = chute.MapDataset.range(30).to_iter_dataset(chute.ReadOptions(num_threads=2))
    ds = ParentedDs(src).batch(5)
    it = iter(ds)
    it.start_prefetch()  # reaches the threads below the user stage
    assert next(it).tolist() == [1, 102, 203, 304, 405]
    it.close()
    assert_equal_output_after_checkpoint(ds)


class Cubes(chute.MapDataset[int]):
    def __init__(self, n: int) -> None:
        super().__init__()
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return (index % self._n) ** 3


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_user_map_dataset_through_shuffle_batch_and_workers(workers: int) -> None:
    def build(w: int) -> chute.IterDataset[Any]:
        ds = Cubes(40).shuffle(seed=5).map(lambda x: x + 1).to_iter_dataset().batch(6)
        return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=w))

    expected = [b.tolist() for b in build(0)]
    assert sorted(x for b in expected for x in b) == sorted(i**3 + 1 for i in range(40))
    assert [b.tolist() for b in build(workers)] == expected
    # Inputs of different kinds have states of different shapes: the slots' shape changes.
    assert_equal_output_after_checkpoint(build(workers), restore_into=build(0), same_shape=False)


def test_user_map_dataset_repeats_with_epochs() -> None:
    ds = Cubes(4).repeat(2)
    assert [ds[i] for i in range(8)] == [0, 1, 8, 27, 0, 1, 8, 27]
    assert list(ds.to_iter_dataset()) == [0, 1, 8, 27, 0, 1, 8, 27]


def test_abstract_methods_are_enforced() -> None:
    class NoLen(chute.MapDataset[int]):
        def __getitem__(self, index: Any) -> Any:
            return index

    with pytest.raises(TypeError, match="abstract"):
        NoLen()  # type: ignore[abstract]

    class NoNext(chute.DatasetIterator[int]):
        pass

    with pytest.raises(TypeError, match="abstract"):
        NoNext()  # type: ignore[abstract]


def test_a_stage_with_neither_iterator_method_cannot_be_made_and_names_the_fix() -> None:
    # As in Grain: an IterDataset subclass without __iter__ is abstract.
    class Empty(chute.IterDataset[int]):
        pass

    with pytest.raises(TypeError, match=r"abstract class Empty .* abstract method '__iter__'"):
        Empty()

    class NoItems(chute.MapDataset[int]):
        def __len__(self) -> int:
            return 3

    with pytest.raises(TypeError, match=r"abstract class NoItems .*'__getitem__'.*implements"):
        NoItems()

    # A subclass of such a class that implements the method can be made.
    class Items(NoItems):
        def __getitem__(self, index):
            return index

    assert list(Items()) == [0, 1, 2]
