"""`IterDataset.even_batches`: the same number of batches on every shard, so that
data-parallel ranks take the same number of steps and none waits at a last step the
others never take.

Every rank builds its shard's pipeline and gives the same `num_batches`, agreed ahead:

- **drop the tail** (`pad=None`): `num_batches` is the smallest count over the shards;
  each shard hands out its first `num_batches` batches and drops the rest. A shard that
  ends sooner raises (never a hang): the count was not the smallest.
- **pad the tail** (`pad=fn`): `num_batches` is the largest count; a shard that ends
  sooner hands out `fn(last_batch)` until it has given `num_batches` (`zeros_like_batch`:
  the last batch with every leaf zeroed, all padding). A shard with more raises.

How to agree on the count: for `ds[i::n].batch(b)` on a `MapDataset` it is computable on
every rank, `len(ds[i::n].batch(b))` for each `i` (shard `i` has `ceil((N - i) / n)`
elements). For batches whose size depends on the data (`batch_by_tokens`,
`bucket_by_sequence_length`) it is not: count each shard's batches once with a pass
over the lengths only (`count_batches`, e.g. on the pipeline with elements mapped to
small arrays of their length and `batch_fn=len`), and all-reduce the min (drop) or max
(pad) across ranks; the count is the same for every epoch of the same data.

The state is the batches handed out and the parent's state; with `pad`, the parent's
state before the last batch it gave, which restoring reads again (the padding's shape,
should the parent end).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from chute._src.core import provenance, tree
from chute._src.core.dataset import IterDataset
from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import DatasetIterator, bad_value, check_int, check_state
from chute._src.core.transforms import describe

WHERE = "even_batches"


def zeros_like_batch(batch: Any) -> Any:
    """`batch` with every leaf replaced by zeros of its shape and dtype: a batch of
    padding (token 0, weight 0, mask 0).

    >>> import numpy as np
    >>> zeros_like_batch({"tokens": np.array([[5, 6]]), "weight": np.array([1.0])})
    {'tokens': array([[0, 0]]), 'weight': array([0.])}
    """
    return tree.map_leaves(np.zeros_like, batch)


def count_batches(ds: Iterable[Any]) -> int:
    """The number of elements (batches) of one pass over `ds`."""
    n = 0
    for _ in ds:
        n += 1
    return n


class EvenBatchesIterDataset(IterDataset[Any]):
    """Exactly `num_batches` elements: the parent's first ones, then, with `pad`, `pad(last)`.

    >>> import chute
    >>> shards = [chute.MapDataset.range(10)[i::3].batch(2) for i in range(3)]
    >>> [len(s) for s in shards]
    [2, 2, 2]
    >>> shards = [chute.MapDataset.range(11)[i::2].batch(2) for i in range(2)]
    >>> [len(s) for s in shards]
    [3, 3]
    >>> shards = [chute.MapDataset.range(9)[i::2].batch(2) for i in range(2)]
    >>> k = min(len(s) for s in shards)
    >>> [[b.tolist() for b in s.to_iter_dataset().even_batches(k)] for s in shards]
    [[[0, 2], [4, 6]], [[1, 3], [5, 7]]]
    >>> k = max(len(s) for s in shards)
    >>> pad = chute.experimental.zeros_like_batch
    >>> [[b.tolist() for b in s.to_iter_dataset().even_batches(k, pad=pad)] for s in shards]
    [[[0, 2], [4, 6], [8]], [[1, 3], [5, 7], [0, 0]]]
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(
        self,
        parent: IterDataset[Any],
        num_batches: int,
        *,
        pad: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__([parent])
        if not isinstance(parent, IterDataset):
            raise TypeError(
                f"{WHERE}: parent {parent!r} is not an IterDataset: call .to_iter_dataset() "
                "on a MapDataset first."
            )
        if isinstance(num_batches, bool) or not isinstance(num_batches, int | np.integer):
            raise TypeError(
                f"{WHERE}: num_batches={num_batches!r} is invalid: it must be an int, the "
                "number of batches every shard hands out (agreed across ranks)."
            )
        if num_batches < 0:
            raise ValueError(
                f"{WHERE}: num_batches={num_batches} is invalid: it must be >= 0, the "
                "number of batches every shard hands out (agreed across ranks)."
            )
        if pad is not None and not callable(pad):
            raise TypeError(
                f"{WHERE}: pad={pad!r} is not callable: pass a function of the last batch "
                "giving a padding batch (chute.experimental.zeros_like_batch), or None to "
                "drop the tail."
            )
        self._count = int(num_batches)
        self._pad = pad

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _EvenIterator(self._parent_iter(), self._count, self._pad)

    def __repr__(self) -> str:
        pad = "None" if self._pad is None else describe(self._pad)
        return f"EvenBatchesIterDataset(num_batches={self._count}, pad={pad})"

    def _fingerprint_params(self) -> str:
        return f"num_batches={self._count}, pad={self._pad is not None}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The parent's batch at `position`; a batch of padding holds no record."""
        if position >= self._count:
            raise provenance.EndOfStream
        parent = self._parents[0]
        if tracer.exists(parent, position):
            return provenance.same_position(position)
        if self._pad is None or not tracer.exists(parent, 0):
            raise provenance.EndOfStream  # the run raises there: the count was not the smallest
        return []


class _EvenIterator(DatasetIterator[Any]):
    stage = "even_batches"

    def __init__(
        self, parent: DatasetIterator[Any], count: int, pad: Callable[[Any], Any] | None
    ) -> None:
        super().__init__(parent)
        self._count, self._pad = count, pad
        self._handed = 0
        self._padding = False
        self._before_last: Any = None  # the parent's state before the last batch read
        self._last: Any = None

    def __next__(self) -> Any:
        if self._handed >= self._count:
            if self._pad is not None and not self._padding:
                self._check_no_more()
            raise StopIteration
        if not self._padding:
            before = self._parent.get_state()
            try:
                x = next(self._parent)
            except StopIteration:
                self._start_padding()
            else:
                self._before_last, self._last = before, x
                self._handed += 1
                return x
        assert self._pad is not None
        self._handed += 1
        return self._pad(self._last)

    def _start_padding(self) -> None:
        if self._pad is None:
            raise ValueError(
                f"{WHERE}: this shard ended after {self._handed} batches, before "
                f"num_batches={self._count}: to drop the tail, num_batches must be the "
                "smallest count over the shards; take the minimum over ranks, or pass "
                "pad=chute.experimental.zeros_like_batch with the largest count."
            )
        if self._last is None:
            raise ValueError(
                f"{WHERE}: this shard has no batch at all, so there is none to shape padding "
                f"batches from (num_batches={self._count}): give every shard at least one "
                "batch, or drop the tail with the smallest count."
            )
        self._padding = True

    def _check_no_more(self) -> None:
        try:
            next(self._parent)
        except StopIteration:
            return
        raise ValueError(
            f"{WHERE}: this shard has more than num_batches={self._count} batches: to pad "
            "the tail, num_batches must be the largest count over the shards; take the "
            "maximum over ranks, or pass pad=None with the smallest count to drop the tail."
        )

    def get_state(self) -> dict[str, Any]:
        # With padding, the parent's state before the last batch: restoring reads that
        # batch again, the shape of the padding should the parent end.
        keep_last = self._pad is not None and self._before_last is not None
        state = {
            "stage": self.stage,
            "handed": self._handed,
            "parent": self._before_last if keep_last else self._parent.get_state(),
        }
        if self.stage_params:
            state["params"] = self.stage_params
        return state

    def _restore(self, state: Any, path: str) -> None:
        keys = {"stage", "handed", "parent"} | ({"params"} if self.stage_params else set())
        check_state(state, self.stage, keys, path)
        if self.stage_params and state["params"] != self.stage_params:
            raise CheckpointError(
                f"{path}['params'] = {state['params']!r}, but this pipeline's {self.stage!r} "
                f"stage has {self.stage_params!r}: rebuild the pipeline with the num_batches "
                "and pad it had when the state was taken."
            )
        handed = check_int(state, "handed", path, 0, self._count, "num_batches")
        self._parent._restore(state["parent"], f"{path}['parent']")
        self._handed, self._padding, self._last, self._before_last = handed, False, None, None
        if self._pad is None or handed == 0:
            return
        try:
            self._last = next(self._parent)
        except StopIteration:
            raise bad_value(
                path,
                "handed",
                handed,
                "with pad, the state's parent is before the last batch handed out, but it "
                "has no batch left",
            ) from None
        self._before_last = state["parent"]
