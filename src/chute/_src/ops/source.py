"""`MapDataset.source` and `MapDataset.range`: the leaves of a pipeline."""

from __future__ import annotations

from typing import Any, Self

import numpy as np

from chute._src.core import provenance
from chute._src.core.contract import StageRole
from chute._src.core.data_source import getitems
from chute._src.core.dataset import MapDataset
from chute._src.core.element_spec import ShapeDtypeStruct
from chute._src.core.errors import add_stage_note
from chute._src.core.set_slice import SlicedSource, check_unbuilt, contiguous_share, reset_memos

SHARE_LISTS_FROM = 10_000
"""List and tuple sources at least this long are shared with workers, not copied."""


class SourceMapDataset(MapDataset[Any]):
    """Reads records from a random-access source, a whole block of indices per call."""

    _role = StageRole.SOURCE

    def __init__(self, source: Any) -> None:
        super().__init__()
        if isinstance(source, MapDataset):
            raise TypeError(
                f"MapDataset.source got {source!r}, which is already a MapDataset: "
                "use it directly instead of wrapping it in source()."
            )
        if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
            raise TypeError(
                f"MapDataset.source got {source!r} of type {type(source).__name__}: a source "
                "must have __len__ and __getitem__ (any Sequence does); wrap an iterable in "
                "list(...) or use an IterDataset."
            )
        self._source = source
        self._len = len(source)

    @property
    def data_source(self) -> Any:
        """The source object this stage reads (Grain's name)."""
        return self._source

    _slices_in_place = True

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Grain's hook: from now on, read only the contiguous share `sl.start` of
        `sl.step` of the source it was made with (`core/set_slice.py`); only before stages
        are built on it. chute's workers never need it: they compute chunks of one order.

        >>> import chute
        >>> ds = chute.MapDataset.source(list(range(10)))
        >>> ds.set_slice(slice(1, None, 3), sequential_slice=True)
        >>> list(ds)
        [4, 5, 6]
        """
        where = "SourceMapDataset.set_slice"
        check_unbuilt(self, where)
        whole = self.__dict__.setdefault("_unsliced", self._source)
        start, end = contiguous_share(len(whole), sl, sequential_slice, where)
        self._source = SlicedSource(whole, start, end)
        self._len = end - start
        reset_memos(self)

    @property
    def _data_source(self) -> object | None:  # type: ignore[override]
        return self._source

    def __len__(self) -> int:
        return self._len

    def _for_workers(self, resources: list[Any]) -> Self:
        """A large list or tuple is written once to shared memory, which every worker maps
        (`SharedListSource`), instead of being pickled into each."""
        source = self._source
        if isinstance(source, list | tuple) and len(source) >= SHARE_LISTS_FROM:
            from chute._src.storage.formats.shared_list import SharedListSource

            shared = SharedListSource(source)
            resources.append(shared)
            return type(self)(shared)
        return self

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        n = self._len
        if n == 0:
            raise IndexError(f"{self!r} is empty: there is no element {int(indices[0])} to read")
        if indices.size and int(indices.max()) >= n:
            indices = indices % n
        keys = indices.tolist()
        try:
            return getitems(self._source, keys)
        except Exception as e:
            add_stage_note(e, self, _first_failing(self._source, keys))
            raise

    def __repr__(self) -> str:
        return f"SourceMapDataset(source={type(self._source).__name__})"

    def _fingerprint_params(self) -> str:
        return f"len={self._len}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The record: its index and epoch, and where a record source declares it
        (`record_location(index)`), its file, shard and record number."""
        origins = provenance.source_record(position, self._len)
        locate = getattr(self._source, "record_location", None)
        if locate is None:
            return origins
        o = origins[0]
        return [o._replace(fields=(*o.fields, *dict(locate(o.position)).items()))]


def _first_failing(source: Any, keys: list[int]) -> int | None:
    """The first index whose single read fails, to name it in the error; None if none does."""
    for k in keys:
        try:
            source[k]
        except Exception:
            return k
    return None


class RangeMapDataset(MapDataset[int]):
    """The integers of `range(start, stop, step)`, computed for a block with numpy."""

    _role = StageRole.SOURCE

    def __init__(self, start: int, stop: int | None = None, step: int = 1) -> None:
        super().__init__()
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ValueError(
                "MapDataset.range step=0 is invalid: step must be non-zero; "
                "use step=1 for consecutive integers."
            )
        self._range = range(start, stop, step)

    def __len__(self) -> int:
        return len(self._range)

    _slices_in_place = True

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Grain's hook: from now on, the contiguous share `sl.start` of `sl.step` of the
        range it was made with (`core/set_slice.py`); only before stages are built on it.

        >>> import chute
        >>> ds = chute.MapDataset.range(10)
        >>> ds.set_slice(slice(0, None, 3), sequential_slice=True)
        >>> list(ds)
        [0, 1, 2, 3]
        """
        where = "RangeMapDataset.set_slice"
        check_unbuilt(self, where)
        whole = self.__dict__.setdefault("_unsliced", self._range)
        start, end = contiguous_share(len(whole), sl, sequential_slice, where)
        self._range = whole[start:end]
        reset_memos(self)

    def _getitems(self, indices: np.ndarray) -> list[int | None]:
        r = self._range
        n = len(r)
        if n == 0:
            raise IndexError(f"{self!r} is empty: there is no element {int(indices[0])} to read")
        pos = indices % n if indices.size and int(indices.max()) >= n else indices
        out: list[int | None] = (pos * r.step + r.start).tolist()
        return out

    def __repr__(self) -> str:
        r = self._range
        return f"RangeMapDataset(start={r.start}, stop={r.stop}, step={r.step})"

    def _fingerprint_params(self) -> str:
        r = self._range
        return f"start={r.start}, stop={r.stop}, step={r.step}"

    @property
    def _element_spec(self) -> Any:
        return ShapeDtypeStruct(shape=(), dtype=np.dtype(np.int64))

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        return provenance.source_record(position, len(self._range))
