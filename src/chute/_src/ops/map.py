"""`IterDataset.map` and `.map_with_index`, and the iterator `.random_map` shares
(`random_map.py`).

`MapDataset.map` and `.map_with_index` (`.random_map`: `random_map.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from chute._src.core import provenance
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset
from chute._src.core.element_spec import transform_output_spec
from chute._src.core.errors import add_stage_note
from chute._src.core.iterator import DatasetIterator, bad_value, check_int, int_at
from chute._src.core.transforms import as_map_fn, as_map_with_index_fn, describe

if TYPE_CHECKING:  # imports numpy.random, which a plain map does not need
    from chute._src.core.element_rngs import ElementRngs
from chute._src.ops.block_apply import failed_position


class MapIterDataset(IterDataset[Any]):
    _role = StageRole.ELEMENT_WISE
    _stage_name = "map"  # what its iterator records in states

    def __init__(self, parent: IterDataset[Any], transform: Any) -> None:
        super().__init__([parent])
        self._fn: Callable[[Any], Any] = as_map_fn(transform, "map")

    def _as_map_stage(self, parent: MapDataset[Any]) -> MapDataset[Any]:
        moved = parent.map(self._fn)
        vars(moved)["_moved_from"] = repr(self)  # what errors name it by (`pipeline_pickle.py`)
        return moved

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _MapIterator(self._parent_iter(), self._fn, self)

    def __repr__(self) -> str:
        return f"MapIterDataset(transform={describe(self._fn)})"

    @property
    def _element_spec(self) -> Any:
        return transform_output_spec(self, self._fn)


class _MapIterator(DatasetIterator[Any]):
    stage = "map"

    def __init__(self, parent: DatasetIterator[Any], fn: Callable[[Any], Any], ds: object) -> None:
        super().__init__(parent)
        self._fn = fn
        self._ds = ds
        self._count = 0  # elements mapped, to name the failing one

    def __next__(self) -> Any:
        x = next(self._parent)
        try:
            y = self._fn(x)
        except Exception as e:
            add_stage_note(e, self._ds, self._count)
            raise
        self._count += 1
        return y

    def _next_many(self, n: int) -> list[Any]:
        xs = self._parent._next_many(n)
        fn = self._fn
        out: list[Any] = []
        append = out.append
        try:
            for x in xs:
                append(fn(x))
        except Exception as e:
            add_stage_note(e, self._ds, self._count + len(out))
            raise
        self._count += len(out)
        return out

    def _count_at(self, state: Any) -> int | None:
        # One element out per element in: the parent's count.
        return self._parent._count_at(state.get("parent")) if isinstance(state, dict) else None


class MapWithIndexIterDataset(IterDataset[Any]):
    def __init__(self, parent: IterDataset[Any], transform: Any) -> None:
        super().__init__([parent])
        self._fn: Callable[[int, Any], Any] = as_map_with_index_fn(transform)

    def _make_iterator(self) -> DatasetIterator[Any]:
        return IndexedIterator(self._parent_iter(), self, self._fn, None)

    def __repr__(self) -> str:
        return f"MapWithIndexIterDataset(transform={describe(self._fn)})"

    @property
    def _element_spec(self) -> Any:
        return transform_output_spec(self, self._fn)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        return provenance.same_position(position)  # element-wise: never run


class IndexedIterator(DatasetIterator[Any]):
    """Counts the elements it has mapped: the index of map_with_index, the key of random_map."""

    stage = "indexed_map"

    def __init__(
        self,
        parent: DatasetIterator[Any],
        ds: IterDataset[Any],
        fn: Callable[..., Any],
        rngs: ElementRngs | None,
    ) -> None:
        """`fn(index, element)` with no `rngs` (map_with_index), else `fn(element, rng)`."""
        super().__init__(parent)
        self._ds = ds
        self._fn = fn
        self._rngs = rngs
        self._index = 0

    def _apply(self, xs: list[Any]) -> list[Any]:
        fn, start = self._fn, self._index
        out: list[Any] = []
        append = out.append
        try:
            if self._rngs is None:
                for i, x in enumerate(xs, start):
                    append(fn(i, x))
            else:
                rngs = self._rngs
                keys = rngs.for_indices(np.arange(start, start + len(xs), dtype=np.int64))
                for k, x in zip(keys.tolist(), xs):
                    append(fn(x, rngs.rng(k)))
        except Exception as e:
            add_stage_note(e, self._ds, start + len(out))
            raise
        self._index = start + len(out)
        return out

    def __next__(self) -> Any:
        return self._apply([next(self._parent)])[0]

    def _next_many(self, n: int) -> list[Any]:
        return self._apply(self._parent._next_many(n))

    def own_state(self) -> dict[str, Any]:
        return {"index": self._index}

    def _count_at(self, state: Any) -> int | None:
        return int_at(state, "index")

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        index = check_int(state, "index", path)
        count = self._parent._count_at(state["parent"])
        if count is not None and index != count:
            raise bad_value(
                path,
                "index",
                index,
                f"it counts the elements mapped, one per element of the parent, whose state "
                f"{path}['parent'] has handed out {count}",
            )
        self._index = index


class MapMapDataset(MapDataset[Any]):
    """Applies a function to each element of a block; filtered (None) elements stay None."""

    def __init__(self, parent: MapDataset[Any], transform: Any) -> None:
        super().__init__([parent])
        self._fn: Callable[[Any], Any] = as_map_fn(transform, "map")

    def __len__(self) -> int:
        return len(self._parents[0])

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        xs = self._parents[0]._getitems(indices)
        fn = self._fn
        it = iter(xs)
        try:
            if self._may_be_none:
                return [None if x is None else fn(x) for x in it]
            return list(map(fn, it))
        except Exception as e:
            add_stage_note(e, self, int(indices[failed_position(it, len(xs))]))
            raise

    def __repr__(self) -> str:
        return f"MapMapDataset(transform={describe(self._fn)})"

    @property
    def _element_spec(self) -> Any:
        return transform_output_spec(self, self._fn)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        return provenance.same_position(position)  # element-wise: never run


class MapWithIndexMapDataset(MapDataset[Any]):
    """Applies `fn(index, element)`; the index counts epochs too (`i + epoch * len`)."""

    def __init__(self, parent: MapDataset[Any], transform: Any) -> None:
        super().__init__([parent])
        self._fn: Callable[[int, Any], Any] = as_map_with_index_fn(transform)

    def __len__(self) -> int:
        return len(self._parents[0])

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        xs = self._parents[0]._getitems(indices)
        fn = self._fn
        it = iter(xs)
        try:
            return [None if x is None else fn(i, x) for x, i in zip(it, indices.tolist())]
        except Exception as e:
            add_stage_note(e, self, int(indices[failed_position(it, len(xs))]))
            raise

    def __repr__(self) -> str:
        return f"MapWithIndexMapDataset(transform={describe(self._fn)})"

    @property
    def _element_spec(self) -> Any:
        return transform_output_spec(self, self._fn)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        return provenance.same_position(position)  # element-wise: never run
