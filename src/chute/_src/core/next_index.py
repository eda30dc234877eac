"""`get_next_index` / `set_next_index`: the position of an iterator over a MapDataset.

They read and write the iterator's state: the `next_index` of its `to_iter_dataset`
reader, reached through stages that hand out one element per element read (`map`, and
`map_with_index`/`random_map`, whose count moves with it), through `limit` (its count
moves with it) and through `batch`, whose index counts batches, as in Grain: batch `i`
starts at element `i * batch_size` below. Prefetching stages are transparent in a state,
so threads and worker processes make no difference. Another stage between (a `filter`,
packing, ...) cannot say which element comes next without reading, and raises.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from chute._src.core.iterator import DatasetIterator
from chute._src.core.state_checks import seal

_ONE_FOR_ONE = ("map", "indexed_map", "limit", "batch")


class NoNextIndexError(ValueError, NotImplementedError):
    """The iterator has no next index (a stage between cannot say which element comes
    next without reading): a `ValueError`, and Grain's `NotImplementedError`."""


_BATCH_SIZE = re.compile(r"\bbatch_size=(\d+)")


def _batch_size(node: dict[str, Any]) -> int:
    found = _BATCH_SIZE.search(str(node.get("params", "")))
    if found is None:  # chute's own state: cannot happen unless edited
        raise ValueError(f"a batch stage's state names no batch_size: {node!r}")
    return int(found.group(1))


def _indices(path: list[dict[str, Any]]) -> list[int]:
    """The next index of each stage of `path` (top down), in the units of its output."""
    out = [int(path[-1]["next_index"])]
    for node in reversed(path[:-1]):
        below = out[0]
        out.insert(0, -(-below // _batch_size(node)) if node["stage"] == "batch" else below)
    return out


def _reader_path(state: Any, where: str) -> list[dict[str, Any]]:
    """The states from the top down to the reader's."""
    path: list[dict[str, Any]] = []
    node = state
    while isinstance(node, dict):
        path.append(node)
        stage = node.get("stage")
        if stage == "to_iter_dataset":
            return path
        if stage not in _ONE_FOR_ONE or "parent" not in node:
            break
        node = node["parent"]
    stage = path[-1].get("stage") if path else None
    raise NoNextIndexError(
        f"{where}: the iterator's stage {stage!r} does not hand out one element per element "
        "of a MapDataset, so it has no next index: use it on the iterator of "
        "`ds.to_iter_dataset()` (with maps, prefetching, workers after it), or save and "
        "restore positions with get_state()/set_state()."
    )


def get_next_index(ds_iter: DatasetIterator[Any]) -> int:
    """The index, in the MapDataset read, of the element `ds_iter` produces next.

    >>> import chute
    >>> it = iter(chute.MapDataset.range(10).to_iter_dataset().map(lambda x: x * 2))
    >>> next(it), next(it), get_next_index(it)
    (0, 2, 2)
    """
    return next_index_of(ds_iter.get_state(), "get_next_index")


def set_next_index(ds_iter: DatasetIterator[Any], index: int) -> None:
    """Moves `ds_iter` so that it produces element `index` of the MapDataset read next,
    without reading the elements between.

    >>> import chute
    >>> it = iter(chute.MapDataset.range(10).to_iter_dataset())
    >>> set_next_index(it, 7)
    >>> list(it)
    [7, 8, 9]
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"set_next_index: index={index!r} is invalid: it must be an int >= 0.")
    ds_iter.set_state(moved(ds_iter.get_state(), index, "set_next_index"))


def moved(state: Any, index: int, where: str) -> Any:
    """A copy of `state` (an iterator's, trusted) whose top stage produces its element
    `index` next, sealed anew; `NoNextIndexError` where a stage between cannot say which
    element that is without reading."""
    state = copy.deepcopy(state)
    path = _reader_path(state, where)
    current = _indices(path)
    for node, now in zip(path[:-1], current):
        stage = node.get("stage")
        if stage == "indexed_map":
            if node.get("index") != now:
                raise NoNextIndexError(
                    f"{where}: a map_with_index/random_map above the reader has mapped "
                    f"{node.get('index')} elements of the first {now} (a filter on the "
                    "MapDataset skips some), so its index cannot be moved without reading: "
                    "save and restore positions with get_state()/set_state()."
                )
            node["index"] = index
        elif stage == "limit":
            node["taken"] = index
        elif stage == "batch":
            index *= _batch_size(node)
    path[-1]["next_index"] = index
    return seal(state)  # an edit of chute's own: sealed anew


def next_index_of(state: Any, where: str) -> int:
    """The next index of the top stage of `state` (see `get_next_index`)."""
    return _indices(_reader_path(state, where))[0]
