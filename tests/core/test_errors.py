"""Errors: user exceptions keep their type and traceback and gain the stage and index."""

from __future__ import annotations

import traceback
from collections.abc import Sequence

import pytest

import chute


def boom_at_7(x: int) -> int:
    if x == 7:
        raise KeyError(f"bad record {x}")
    return x


@pytest.mark.parametrize("threads", [0, 2])
def test_map_error_surfaces_at_its_element_with_stage_and_index(threads: int) -> None:
    ds = chute.MapDataset.range(20).map(boom_at_7)
    it = iter(ds.to_iter_dataset(chute.ReadOptions(num_threads=threads, prefetch_buffer_size=8)))
    assert [next(it) for _ in range(7)] == list(range(7))  # elements before it still come
    with pytest.raises(KeyError, match="bad record 7") as info:
        next(it)
    notes = "\n".join(info.value.__notes__)
    assert "MapMapDataset(transform=boom_at_7" in notes and "element index 7" in notes
    assert "boom_at_7" in "".join(traceback.format_tb(info.value.__traceback__))


def test_iter_stage_errors_name_their_stage() -> None:
    ds = chute.MapDataset.range(10).to_iter_dataset().filter(lambda x: 1 / (x - 4))
    with pytest.raises(ZeroDivisionError) as info:
        list(ds)
    assert "FilterIterDataset" in info.value.__notes__[0]
    assert "element index 4" in info.value.__notes__[0]


def test_only_the_innermost_stage_adds_a_note() -> None:
    ds = chute.MapDataset.range(10).map(boom_at_7).map(lambda x: x).batch(4)
    with pytest.raises(KeyError) as info:
        list(ds)
    assert len(info.value.__notes__) == 1


class FlakySource(Sequence[int]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:  # type: ignore[override]
        if i == 3:
            raise OSError("disk read failed")
        return i


def test_source_errors_name_the_record() -> None:
    ds = chute.MapDataset.source(FlakySource()).shuffle(seed=0)
    with pytest.raises(OSError, match="disk read failed") as info:
        list(ds)
    assert "SourceMapDataset(source=FlakySource) at element index 3" in info.value.__notes__[0]


# Several cases pass a value of the wrong type on purpose: the runtime check is what is
# tested. Type checkers reject them too; their `type: ignore` comments say where.
@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: chute.MapDataset.range(5).batch(0), ValueError, r"batch_size=0 is invalid.*> 0"),
        (lambda: chute.MapDataset.range(5).batch(-2), ValueError, r"batch_size=-2"),
        (lambda: chute.MapDataset.range(5).batch(2.5), TypeError, r"batch_size=2.5.*an int"),  # type: ignore[call-overload]
        (lambda: chute.MapDataset.range(5)[::0], ValueError, r"step must be non-zero"),
        (lambda: chute.MapDataset.range(0, 5, 0), ValueError, r"step=0 is invalid"),
        (lambda: chute.MapDataset.range(5).map(3), TypeError, r"3 of type int is not callable"),  # type: ignore[call-overload]
        (
            lambda: chute.MapDataset.range(5).filter("x"),  # type: ignore[arg-type]
            TypeError,
            r"not callable.*FilterTransform",
        ),
        (lambda: chute.MapDataset.range(5).repeat(0), ValueError, r"num_epochs=0.*positive int"),
        (lambda: chute.MapDataset.range(5).seed(1.5), TypeError, r"seed=1.5.*must be an int"),  # type: ignore[arg-type]
        (
            lambda: chute.MapDataset.source(iter([1])),  # type: ignore[arg-type]
            TypeError,
            r"must have __len__ and __getitem__",
        ),
        (lambda: chute.MapDataset.range(3).to_iter_dataset(4), TypeError, r"not a ReadOptions"),  # type: ignore[arg-type]
        (lambda: chute.ReadOptions(num_threads=-1), ValueError, r"num_threads=-1.*>= 0"),
        (lambda: chute.MapDataset.range(5)["a"], TypeError, r"index 'a'.*int or a slice"),  # type: ignore[call-overload]
    ],
)
def test_bad_arguments_name_value_rule_and_fix(build: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        build()  # type: ignore[operator]


def test_wrong_transform_kind_points_to_the_right_method() -> None:
    class Noise(chute.RandomMapTransform):
        def random_map(self, element: int, rng: object) -> int:
            return element

    # Wrong on purpose, as above: mypy rejects both calls as well.
    with pytest.raises(TypeError, match=r"is a RandomMapTransform.*use \.random_map"):
        chute.MapDataset.range(3).map(Noise())  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"got the class Noise, not an instance"):
        chute.MapDataset.range(3).map(Noise)  # type: ignore[arg-type]


def test_closed_iterator_says_so() -> None:
    it = iter(chute.MapDataset.range(10_000).to_iter_dataset())
    next(it)
    it.close()
    with pytest.raises(RuntimeError, match="closed iterator"):
        list(it)
