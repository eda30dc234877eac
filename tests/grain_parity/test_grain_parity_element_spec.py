"""`ShapeDtypeStructProtocol` is checked with `isinstance`, as Grain's is; element specs are
inferred from the stages as Grain's are (`core/element_spec.py`)."""

import functools
from typing import Any

import numpy as np
import pytest

import chute


def test_shape_dtype_struct_protocol_is_runtime_checkable() -> None:
    proto = chute.experimental.ShapeDtypeStructProtocol
    spec = chute.experimental.ShapeDtypeStruct(shape=(2,), dtype=np.int64)
    assert isinstance(spec, proto)
    assert isinstance(np.zeros(3), proto)
    assert not isinstance(3, proto)
    assert not isinstance({"shape": (2,)}, proto)


# Element specs are inferred from the stages as Grain's are (`core/element_spec.py`).

SDS = chute.experimental.ShapeDtypeStruct
INT64 = np.dtype(np.int64)


class _Counted(chute.transforms.Map):
    """x -> {"x": [x] * 3}, counting its calls, with Grain's `output_spec`."""

    def __init__(self) -> None:
        self.calls = 0

    def map(self, element: int) -> dict[str, Any]:
        self.calls += 1
        return {"x": np.full(3, element)}

    def output_spec(self, input_spec: Any) -> Any:
        assert input_spec == SDS(shape=(), dtype=INT64), input_spec
        return {"x": SDS(shape=(3,), dtype=input_spec.dtype)}


def test_a_batch_has_a_leading_axis_of_none_unless_it_drops_its_remainder() -> None:
    ds = chute.MapDataset.range(10)
    assert ds._element_spec == SDS(shape=(), dtype=INT64)
    assert ds.batch(4)._element_spec == SDS(shape=(None,), dtype=INT64)
    assert ds.batch(4, drop_remainder=True)._element_spec == SDS(shape=(4,), dtype=INT64)
    it = ds.to_iter_dataset().batch(3, drop_remainder=True)
    assert chute.experimental.get_element_spec(it) == SDS(shape=(3,), dtype=INT64)


def test_a_transform_with_output_spec_is_inferred_without_reading() -> None:
    t = _Counted()
    ds = chute.MapDataset.range(10).shuffle(seed=1).map(t).to_iter_dataset().filter(bool)
    spec = chute.experimental.get_element_spec(ds.batch(2, drop_remainder=True))
    assert spec == {"x": SDS(shape=(2, 3), dtype=INT64)}
    assert ds._element_spec == {"x": SDS(shape=(3,), dtype=INT64)}
    assert t.calls == 0


def test_a_map_without_output_spec_raises_in_inference_and_is_computed_by_get_element_spec() -> (
    None
):
    ds = chute.MapDataset.range(10).map(lambda x: np.full(2, x, dtype=np.float32))
    with pytest.raises(ValueError, match="does not implement `output_spec`"):
        _ = ds._element_spec
    with pytest.raises(ValueError, match="does not implement `output_spec`"):
        _ = ds.batch(4)._element_spec  # a stage after it asks it
    # get_element_spec computes the first element of the map, and infers the batch after.
    spec = chute.experimental.get_element_spec(ds.batch(4))
    assert spec == SDS(shape=(None, 2), dtype=np.dtype(np.float32))


def test_an_output_spec_error_reaches_the_caller() -> None:
    batches: chute.MapDataset[Any] = chute.MapDataset.range(10).batch(2)
    ds = batches.map(_Counted())  # a (None,) spec, where it asserts ()
    with pytest.raises(AssertionError):
        _ = ds._element_spec
    with pytest.raises(AssertionError):
        chute.experimental.get_element_spec(ds)


def test_a_stage_with_no_rule_raises_not_implemented() -> None:
    ds = chute.MapDataset.source([1, 2, 3])
    with pytest.raises(NotImplementedError, match="not implemented for SourceMapDataset"):
        _ = ds._element_spec
    assert chute.experimental.get_element_spec(ds.repeat(2)) == SDS(shape=(), dtype=INT64)


class _BatchWithSpec:
    def __call__(self, xs: list[int]) -> dict[str, np.ndarray]:
        return {"batch": np.asarray(xs)}

    def output_spec(self, input_spec: Any, batch_size: int, drop_remainder: bool) -> Any:
        return {"batch": SDS(shape=(batch_size,), dtype=input_spec.dtype)}


def _plain_batch(xs: list[int], scale: int) -> np.ndarray:
    return np.asarray(xs) * scale


def test_batch_functions_give_their_spec_or_are_computed() -> None:
    ds = chute.MapDataset.range(10)
    assert ds.batch(3, batch_fn=_BatchWithSpec())._element_spec == {
        "batch": SDS(shape=(3,), dtype=INT64)
    }
    custom = ds.batch(3, batch_fn=functools.partial(_plain_batch, scale=2))
    with pytest.raises(NotImplementedError, match="custom batching functions"):
        _ = custom._element_spec
    assert chute.experimental.get_element_spec(custom) == SDS(shape=(3,), dtype=INT64)
    padded = ds.map(_Counted()).batch(4, padding_struct={"x": 8})
    assert padded._element_spec == {"x": SDS(shape=(None, 8), dtype=INT64)}


def test_stages_that_keep_their_elements_hand_the_spec_on() -> None:
    a = chute.MapDataset.range(10)
    b = chute.MapDataset.range(5)
    leaf = SDS(shape=(), dtype=INT64)
    for ds in (
        a.shuffle(seed=2).slice(slice(1, 5)).repeat(3).filter(bool),
        chute.MapDataset.mix([a, b], [1, 2]),
        chute.MapDataset.concatenate([a, b]),
        a.to_iter_dataset().limit(3).prefetch(2),
        chute.IterDataset.mix([a.to_iter_dataset(), b.to_iter_dataset()]),
        chute.experimental.WindowShuffleIterDataset(a.to_iter_dataset(), window_size=3, seed=1),
    ):
        assert ds._element_spec == leaf, ds
    zipped = chute.experimental.ZipMapDataset([a, b])
    assert zipped._element_spec == (leaf, leaf)
    rebatched = chute.experimental.RebatchIterDataset(a.to_iter_dataset().batch(4), 2)
    assert rebatched._element_spec == SDS(shape=(2,), dtype=INT64)


def test_a_user_stage_written_as_in_grain_gives_its_own_spec() -> None:
    class Pairs(chute.IterDataset[Any]):
        def __iter__(self) -> Any:
            return iter(self.parents[0].map(lambda x: (x, x)))  # type: ignore[attr-defined]

        @property
        def _element_spec(self) -> Any:
            spec = chute.experimental.get_element_spec(self.parents[0])
            return (spec, spec)

    ds = Pairs(chute.MapDataset.range(3).to_iter_dataset()).batch(2)
    leaf = SDS(shape=(None,), dtype=INT64)
    assert chute.experimental.get_element_spec(ds) == (leaf, leaf)


def test_enable_shared_memory_output_is_accepted_and_changes_nothing() -> None:
    ds = chute.MapDataset.range(10).to_iter_dataset().batch(4, drop_remainder=True)
    before = [b.tolist() for b in ds]
    ds.enable_shared_memory_output()  # type: ignore[attr-defined]
    assert [b.tolist() for b in ds] == before
    assert ds._element_spec == SDS(shape=(4,), dtype=INT64)
