"""`skip` and `skip_state`: move an iterator, or a saved state, `n` steps on, as if those
steps had been consumed (after a loss spike: restart earlier, skip the bad range).

Where the position is index arithmetic (a `MapDataset` chain of shuffles, slices,
repeats, mixes and maps, without a filter, read by `to_iter_dataset`, then maps, batches, prefetching and
worker processes), a step is a known number of the reader's indices, so the move is O(1):
the state's `next_index` (and the counters of `random_map`, `limit`) are set as
`set_next_index` sets them, and nothing is read. Any other stage between (a filter of an
`IterDataset`, packing, batching by tokens, a mixture drawing at random) cannot say where
step `n` begins without reading, nor can a filter of the `MapDataset` (the reader skips
the elements it drops), so the iterator reads the `n` steps and drops them:
every stage computes what it must, user maps included.

The torch layer (`chute.torch.IterableDataset`) moves its own iterator and states
(`frameworks/torch_skip.py`): `skip` calls an iterator's `_skip(n)` where its class has
one, and `skip_state` a dataset's `_skip_state(state, n)`. Any other iterator (a torch
`DataLoader`'s) is read: its `n` steps are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import DatasetIterator
from chute._src.core.next_index import NoNextIndexError, _reader_path, moved, next_index_of
from chute._src.core.state_checks import check_bounds, verify


def _check_steps(n: object, where: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(
            f"{where}: n={n!r} is invalid: the number of steps to skip must be an int >= 0 "
            "(an iterator cannot go back; to return to an earlier step, restore a state "
            "saved before it)."
        )
    return n


# The MapDataset stages that leave holes (None) where they drop an element, as a state's
# "pipeline" names them: the reader skips the holes, so it hands out fewer elements than
# it reads indices, and a step is no known number of indices.
_LEAVE_HOLES = ("Filter(", "FlatMap(")


def _index_arithmetic(state: Any, where: str) -> int:
    """The next index of the state's top stage, where a step is a known number of the
    reader's indices; `NoNextIndexError` where it is not."""
    path = _reader_path(state, where)
    entries = path[-1].get("pipeline", [])
    if any(str(e).startswith(_LEAVE_HOLES) for e in entries):
        raise NoNextIndexError(
            f"{where}: the MapDataset read filters elements out ({[str(e) for e in entries]}), "
            "so a step is no known number of its indices: the steps are read."
        )
    return next_index_of(state, where)


def skip(ds_iter: DatasetIterator[Any] | Iterator[Any], n: int) -> int:
    """Advances `ds_iter` by `n` steps (elements or batches, as it yields them) and returns
    how many it skipped: `n`, or fewer where a finite stream ended first (when it is read).

    What follows is what follows `n` calls of `next`; the state it then gives restores to
    it with any number of workers. O(1) where the position is index arithmetic.

    `ds_iter` may also be `iter(chute.torch.IterableDataset)` (moved in O(1) where its
    positions are index arithmetic) or any other iterator, such as a torch `DataLoader`'s
    (with any `num_workers`): the `n` steps are read and dropped, since its workers have
    already started on them; for O(1) there, move the saved state: `skip_state(
    loader.state_dict(), n, dataset=torch_iterable_dataset)` (docs/loss_spike.md).

    >>> import chute
    >>> ds = chute.MapDataset.range(10**9).seed(0).shuffle().batch(4).to_iter_dataset()
    >>> a, b = iter(ds), iter(ds)
    >>> skip(a, 10**6)  # O(1): no element is read
    1000000
    >>> b.set_state(skip_state(b.get_state(), 10**6))
    >>> bool((next(a) == next(b)).all())
    True
    """
    n = _check_steps(n, "skip")
    if not isinstance(ds_iter, DatasetIterator):
        own = getattr(type(ds_iter), "_skip", None)
        if callable(own):  # an iterator that can move itself (the torch layer's)
            return int(own(ds_iter, n))
        if not isinstance(ds_iter, Iterator):
            raise TypeError(
                f"skip: {ds_iter!r} is not an iterator: give what iter() returned (of a "
                "dataset, a DataLoader, a torch DataLoader), or move a saved state with "
                "skip_state."
            )
        return _read(ds_iter, n)
    if n == 0:
        return 0
    state = ds_iter.get_state()
    try:
        start = _index_arithmetic(state, "skip")
        target = moved(state, start + n, "skip")
    except NoNextIndexError:
        return _read(ds_iter, n)  # a stage between must read to know where step n begins
    try:
        ds_iter.set_state(target)
    except CheckpointError:
        # Past the end of a finite stream (the state names an index past it, and the
        # iterator is left where it was): read to the end, counting.
        return _read(ds_iter, n)
    return n


def _read(ds_iter: Iterator[Any], n: int) -> int:
    """Reads and drops up to `n` steps; how many there were."""
    for done in range(n):
        try:
            next(ds_iter)
        except StopIteration:
            return done
    return n


def skip_state(state: Any, n: int, dataset: Any = None) -> Any:
    """`state` (from `get_state()`, a checkpoint, a `state_dict`'s chute part) moved `n`
    steps on: what the iterator would give after consuming those steps.

    Where the position is index arithmetic the state is edited in O(1) and `dataset` is not
    needed (past the end of a finite stream, such a state names an index past it, which
    `set_state` refuses; with `dataset=` the move stops at the end). Otherwise give the
    pipeline (`dataset`, the `IterDataset` or `DataLoader` the state came from): an
    iterator is made, restored, moved by `skip` and its state returned, so a state from
    another pipeline raises `CheckpointError` as `set_state` does.

    With `dataset=` a `chute.torch.IterableDataset`, `state` is one copy's `state_dict()`
    (read with `num_workers=0`) or a torchdata `StatefulDataLoader`'s `state_dict()`
    (every worker's copy): moved `n` of the loader's steps on, its workers taking turns,
    within the epoch (a loader reads one per iteration; the move stops at its end), each
    copy in O(1) where its positions are index arithmetic. Load it with
    `loader.load_state_dict(...)`, then iterate.
    """
    n = _check_steps(n, "skip_state")
    own = getattr(dataset, "_skip_state", None)
    if callable(own) and not hasattr(dataset, "_origins"):
        # Not a pipeline but an object that moves its own states (chute.torch.IterableDataset).
        return own(state, n)
    if dataset is not None:
        it = iter(dataset)
        try:
            it.set_state(state)
            skip(it, n)
            return it.get_state()
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
    check_bounds(state, "skip_state")
    verify(state, "skip_state")  # never seal anew a state changed since it was saved
    try:
        return moved(state, _index_arithmetic(state, "skip_state") + n, "skip_state")
    except NoNextIndexError as e:
        raise NoNextIndexError(
            f"{e} skip_state cannot move this state without reading: give the pipeline "
            "it came from, skip_state(state, n, dataset=ds), and it reads the steps."
        ) from None
