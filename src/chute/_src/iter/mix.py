"""`IterDataset.mix`: interleave iterable datasets in given proportions, deterministically.

The schedule is Grain's (see `chute._src.mixing`): position `k` of the mixture comes from
a dataset fixed by `k` and the weights alone, so the output never depends on timing or
workers. The state is the position and each component's own state, keyed by name when the
components are given as a dict: such a mixture can be restored after its weights changed
or components were added (a new component starts from its beginning).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chute._src.dataset import IterDataset
from chute._src.errors import CheckpointError
from chute._src.iterator import DatasetIterator, bad_value, check_int, check_state, int_at
from chute._src.mixing import Schedule, int_proportions


class MixedIterDataset(IterDataset[Any]):
    """Elements of `datasets` interleaved in the proportions of `weights`; ends with the first
    component that runs out.

    >>> import chute
    >>> a = chute.MapDataset.range(5).to_iter_dataset()
    >>> b = chute.MapDataset.range(7, 10).to_iter_dataset()
    >>> list(chute.IterDataset.mix([a, b]))
    [0, 7, 1, 8, 2, 9, 3]
    >>> list(chute.IterDataset.mix({"a": a, "b": b}, {"a": 2, "b": 1}))
    [0, 1, 7, 2, 3, 8, 4]
    """

    def __init__(
        self,
        datasets: Sequence[IterDataset[Any]] | Mapping[str, IterDataset[Any]],
        weights: Sequence[float] | Mapping[str, float] | None = None,
    ) -> None:
        where = "IterDataset.mix"
        self._names: list[str] | None = None
        if isinstance(datasets, Mapping):
            self._names = list(datasets)
            parents = [datasets[k] for k in self._names]
            if weights is not None:
                if not isinstance(weights, Mapping) or set(weights) != set(self._names):
                    raise ValueError(
                        f"{where}: weights={weights!r} do not match the datasets' names "
                        f"{self._names}: for datasets given as a dict, give weights as a "
                        "dict with the same keys."
                    )
                weights = [weights[k] for k in self._names]
        else:
            parents = list(datasets)
            if isinstance(weights, Mapping):
                raise TypeError(f"{where}: weights is a dict but datasets is a list: use one form.")
        if not parents or not all(isinstance(p, IterDataset) for p in parents):
            raise TypeError(
                f"{where}: datasets={datasets!r} is invalid: pass a non-empty list or dict of "
                "IterDatasets (MapDatasets: use .to_iter_dataset() or MapDataset.mix)."
            )
        super().__init__(parents)
        self._schedule = Schedule(int_proportions(weights, len(parents), where), where)

    def make_iterator(self) -> DatasetIterator[Any]:
        return _MixIterator([self._parent_iter(i) for i in range(len(self._parents))], self)

    def __repr__(self) -> str:
        return f"MixedIterDataset(proportions={list(self._schedule.proportions)})"


class _MixIterator(DatasetIterator[Any]):
    stage = "mix"

    def __init__(self, parents: list[DatasetIterator[Any]], ds: MixedIterDataset) -> None:
        super().__init__(parents)
        self._parents = parents
        self._names = ds._names
        self._schedule = ds._schedule
        self._initial = [p.get_state() for p in parents]
        self._index = 0

    def __next__(self) -> Any:
        which = int(self._schedule.which[self._index % self._schedule.period])
        x = next(self._parents[which])
        self._index += 1
        return x

    def _next_many(self, n: int) -> list[Any]:
        which, _ = self._schedule.locate(np.arange(self._index, self._index + n, dtype=np.int64))
        out: list[Any] = [None] * n
        end = n
        for i in np.unique(which).tolist():
            slots = np.flatnonzero(which == i)
            got = self._parents[i]._next_many(len(slots))
            for j, x in zip(slots.tolist(), got):
                out[j] = x
            if len(got) < len(slots):
                end = min(end, int(slots[len(got)]))
        self._index += end
        return out[:end]

    def get_state(self) -> dict[str, Any]:
        states = [p.get_state() for p in self._parents]
        parents: Any = states if self._names is None else dict(zip(self._names, states))
        return {"stage": self.stage, "index": self._index, "parents": parents}

    def _count_at(self, state: Any) -> int | None:
        return int_at(state, "index")

    def _restore(self, state: Any, path: str) -> None:
        check_state(state, self.stage, {"stage", "index", "parents"}, path)
        index = check_int(state, "index", path)
        parents = state["parents"]
        if self._names is None:
            if not isinstance(parents, list) or len(parents) != len(self._parents):
                raise CheckpointError(
                    f"{path}['parents'] is not a list of {len(self._parents)} states: the state "
                    "is from a mixture of other datasets; restore a state of this mixture "
                    "(give datasets as a dict to restore across changes of components)."
                )
            for i, (p, s) in enumerate(zip(self._parents, parents)):
                p._restore(s, f"{path}['parents'][{i}]")
            self._check_index(index, parents, path)
        else:
            if not isinstance(parents, dict):
                raise CheckpointError(
                    f"{path}['parents'] is a {type(parents).__name__}, not a dict of states by "
                    "name: the state is from a mixture given as a list; build the mixture the "
                    "same way it was built when the state was taken."
                )
            for name, p, initial in zip(self._names, self._parents, self._initial):
                s = parents.get(name, initial)
                p._restore(s, f"{path}['parents'][{name!r}]")
            # Weights and components may have changed since (that is what names are for),
            # so the index is not tied to the inputs' positions; only to their total.
            counts = [p._count_at(parents.get(n)) for n, p in zip(self._names, self._parents)]
            if len(parents) == len(self._names) and all(c is not None for c in counts):
                total = sum(c for c in counts if c is not None)
                if index > total:
                    raise bad_value(
                        path,
                        "index",
                        index,
                        f"the mixture cannot have handed out more elements than its inputs "
                        f"did ({total})",
                    )
        self._index = index

    def _check_index(self, index: int, parents: list[Any], path: str) -> None:
        """`index` against the inputs' positions: the schedule gives each input its share
        of the first `index` positions, so each input has handed out at least that many
        (more only when another input ran out in the middle of a block)."""
        sched = self._schedule
        full, rest = divmod(index, sched.period)
        shares = [full * p for p in sched.proportions]
        for i in sched.which[:rest].tolist():
            shares[i] += 1
        for i, (p, s, share) in enumerate(zip(self._parents, parents, shares)):
            count = p._count_at(s)
            if count is not None and count < share:
                raise bad_value(
                    path,
                    "index",
                    index,
                    f"the first {index} positions of the mixture take {share} elements of "
                    f"input {i} (proportions {list(sched.proportions)}), but its state "
                    f"{path}['parents'][{i}] has handed out {count}",
                )
