"""`IterDataset.repeat` / `experimental.RepeatIterDataset`: the same stream again.

`MapDataset.repeat`: more epochs of the same elements (each shuffled anew upstream).
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from chute._src.core import provenance
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.iterator import DatasetIterator, bad_value, check_int

T = TypeVar("T")


def check_count(value: Any, name: str, where: str, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        none = ", or None for no limit" if allow_none else ""
        raise ValueError(f"{where}: {name}={value!r} is invalid: it must be a positive int{none}.")
    return value


class RepeatIterDataset(IterDataset[T]):
    """Repeats the stream `num_epochs` times (forever with None), by restoring the parent's
    starting state; every epoch is identical (for a new shuffle per epoch, repeat the
    MapDataset before `to_iter_dataset`). An empty stream stays empty.

    >>> import chute
    >>> list(chute.MapDataset.range(3).to_iter_dataset().repeat(2))
    [0, 1, 2, 0, 1, 2]
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, parent: IterDataset[T], num_epochs: int | None = None) -> None:
        super().__init__([parent])
        self._epochs = check_count(num_epochs, "num_epochs", "repeat")

    def _make_iterator(self) -> DatasetIterator[T]:
        return _RepeatIterator(self._parent_iter(), self._epochs)

    def __repr__(self) -> str:
        return f"RepeatIterDataset(num_epochs={self._epochs})"

    def _fingerprint_params(self) -> str:
        return f"num_epochs={self._epochs}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """Pass `position // n` of the parent's `n` elements, at `position % n`; `n` is
        found by asking whether the parent has an element at a position (O(log n) asks,
        each as costly as the parent's own `_origins`)."""
        parent = self._parents[0]
        if tracer.exists(parent, position):
            return [provenance.Origin(0, position)]
        memo = tracer.memo(self)
        if "length" not in memo:
            memo["length"] = provenance.length_of(parent, tracer, position)
        n = memo["length"]
        epoch, pos = divmod(position, n) if n else (0, 0)
        if n == 0 or (self._epochs is not None and epoch >= self._epochs):
            raise provenance.EndOfStream
        return [provenance.Origin(0, pos, fields=(("epoch", epoch),))]


class _RepeatIterator(DatasetIterator[T]):
    stage = "repeat"

    def __init__(self, parent: DatasetIterator[T], epochs: int | None) -> None:
        super().__init__(parent)
        self._epochs = epochs
        self._start = parent.get_state()
        self._epoch = 0
        self._in_epoch = 0  # elements of this epoch handed out (an empty epoch ends all)

    def __next__(self) -> T:
        while self._epochs is None or self._epoch < self._epochs:
            try:
                x = next(self._parent)
            except StopIteration:
                if self._in_epoch == 0:
                    self._epoch = self._epochs or self._epoch
                    raise
                self._epoch += 1
                self._in_epoch = 0
                if self._epochs is None or self._epoch < self._epochs:
                    self._parent._restore(self._parent._catch_up(self._start), "state['parent']")
                continue
            self._in_epoch += 1
            return x
        raise StopIteration

    def own_state(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "in_epoch": self._in_epoch}

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        epochs = self._epochs
        if epochs is None:
            epoch = check_int(state, "epoch", path)
        else:
            epoch = check_int(
                state, "epoch", path, 0, epochs, f"an epoch of num_epochs={epochs}, or the end"
            )
        in_epoch = check_int(state, "in_epoch", path)
        if epoch == epochs and in_epoch:
            raise bad_value(
                path,
                "in_epoch",
                in_epoch,
                f"epoch {epoch} is the end of all num_epochs={epochs}, where nothing is handed out",
            )
        count, start = self._parent._count_at(state["parent"]), self._parent._count_at(self._start)
        into = None if count is None or start is None or epoch == epochs else count - start
        if into is not None and in_epoch != into:
            raise bad_value(
                path,
                "in_epoch",
                in_epoch,
                f"it counts the elements of this epoch, and the parent's state "
                f"{path}['parent'] is {into} elements into it",
            )
        self._epoch, self._in_epoch = epoch, in_epoch


class RepeatMapDataset(MapDataset[T]):
    """Extends the index space; the parent reads index `i` as epoch `i // len(parent)`."""

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(
        self,
        parent: MapDataset[T],
        num_epochs: int | None = None,
        *,
        reseed_each_epoch: bool = True,
    ) -> None:
        super().__init__([parent])
        # False: every epoch reads the first epoch's positions, so shuffles and random maps
        # before the repeat give the same order and draws each epoch (Grain's option).
        self._reseed = bool(reseed_each_epoch)
        if num_epochs is not None and (
            isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs <= 0
        ):
            raise ValueError(
                f"repeat num_epochs={num_epochs!r} is invalid: it must be a positive int, or "
                "None to repeat forever."
            )
        n = len(parent)
        if n >= INFINITE:  # as Grain
            raise ValueError(
                f"repeat of {parent!r}, which already repeats forever, does nothing: remove "
                "this repeat (or the one before)."
            )
        self._num_epochs = num_epochs
        if num_epochs is None:
            self._len = INFINITE if n > 0 else 0
        else:
            self._len = min(n * num_epochs, INFINITE)

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[T | None]:
        if not self._reseed:
            n = len(self._parents[0])
            if n and indices.size and int(indices.max()) >= n:
                indices = indices % n
        return self._parents[0]._getitems(indices)

    def __repr__(self) -> str:
        if not self._reseed:
            return f"RepeatMapDataset(num_epochs={self._num_epochs}, reseed_each_epoch=False)"
        return f"RepeatMapDataset(num_epochs={self._num_epochs})"

    def _fingerprint_params(self) -> str:
        if not self._reseed:
            return f"num_epochs={self._num_epochs}, reseed_each_epoch=False"
        return f"num_epochs={self._num_epochs}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        if not self._reseed:
            n = len(self._parents[0])
            if n:
                position %= n
        return provenance.same_position(position)
