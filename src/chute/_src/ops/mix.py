"""`IterDataset.mix`: interleave iterable datasets in given proportions, deterministically.

The schedule is Grain's (see `chute._src.ops.mix_schedule`): position `k` of the mixture comes from
a dataset fixed by `k` and the weights alone, so the output never depends on timing or
workers. The state is the position and each component's own state, keyed by name when the
components are given as a dict: such a mixture can be restored after its weights changed
or components were added (a new component starts from its beginning).

Weights may change during a run: a function of the step (`weights(step)`, with `step =
position // step_size`), or `set_weights` on the iterator between steps
(`mix_iterator.py`; each change is recorded by position in the state, `mix_schedule.py`).

`MapDataset.mix` and `MapDataset.select_from_datasets`: random access into a mixture.

With weights that are a function of the step (`weights(step)`, `step = position //
step_size`), position `k` is drawn from the schedule of its step's weights at `k % period`
(`mixing.Weights`), and its element in that input is the input's count of positions
before `k`: the counts at the start of each step are summed step by step once (kept, a few
integers per step) up to the furthest step asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chute._src.core import provenance
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.iterator import (
    DatasetIterator,
    walk_iterators,
)
from chute._src.core.transforms import describe
from chute._src.ops.mix_schedule import Schedule, Weights, grain_proportions, int_proportions


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

    _keeps_element_spec = True  # its elements are its first parent's
    # Its iterator's weights can be set between steps (`set_weights`), which provenance
    # reads by mixture (`core/provenance.py`, `changes_by_mixture`).
    _weights_set_at_run_time = True

    def __init__(
        self,
        datasets: Sequence[IterDataset[Any]] | Mapping[str, IterDataset[Any]],
        weights: Sequence[float] | Mapping[str, float] | Callable[[int], Any] | None = None,
        *,
        step_size: int = 1,
    ) -> None:
        where = "IterDataset.mix"
        self._names: list[str] | None = None
        fixed = None if callable(weights) else weights
        if isinstance(datasets, Mapping):
            self._names = list(datasets)
            parents = [datasets[k] for k in self._names]
            if fixed is not None and (
                not isinstance(fixed, Mapping) or set(fixed) != set(self._names)
            ):
                raise ValueError(
                    f"{where}: weights={weights!r} do not match the datasets' names "
                    f"{self._names}: for datasets given as a dict, give weights as a "
                    "dict with the same keys."
                )
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
        self._weights = Weights(
            weights,
            len(parents),
            where,
            names=self._names,
            step_size=step_size,
            runtime_zero=True,  # a function of the step may switch an input off
        )

    def _make_iterator(self) -> DatasetIterator[Any]:
        from chute._src.ops.mix_iterator import MixIterator

        parents = [self._parent_iter(i) for i in range(len(self._parents))]
        return MixIterator(parents, self._names, self._weights)

    def _cache_identity(self) -> dict[str, Any]:
        w = self._weights
        weights: Any = w.fn if w.fn is not None else w.at_step(0).proportions
        return {"names": self._names, "weights": weights, "step_size": w.step_size}

    def __repr__(self) -> str:
        w = self._weights
        if w.fn is not None:
            return f"MixedIterDataset(weights={describe(w.fn)}, step_size={w.step_size})"
        return f"MixedIterDataset(proportions={list(w.at_step(0).proportions)})"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The input drawn at `position` and its rank among that input's draws, by the
        weights in force at each draw: those the mixture was built with, and those set at
        run time (`set_weights`) from the position each was set at, as the iterator or
        state provenance was given records them (`tracer.changes_of(self)`); the mixture
        ends where an input drawn from has ended."""
        w = self._weights
        counts = tracer.memo(self).setdefault(
            "counts", StepCounts(w, [INFINITE] * len(self._parents))
        )
        upto = np.arange(position + 1, dtype=np.int64)
        which, keys = counts.locate(upto)
        changes = tracer.changes_of(self)
        if changes:
            positions = [p for p, _ in changes]
            for (start, weights), end in zip(changes, [*positions[1:], position + 1]):
                schedule = w.schedule_of(weights, allow_zero=True)
                seg = upto[start:end]
                which[start:end] = schedule.which[seg % schedule.period]
            keys = np.empty_like(which)
            for i in np.unique(which).tolist():
                sel = which == i
                keys[sel] = np.arange(int(sel.sum()), dtype=np.int64)
        for i in np.unique(which).tolist():  # each input's last draw up to here exists
            last = int(keys[which == i].max())
            if not tracer.exists(self._parents[i], last):
                raise provenance.EndOfStream
        i = int(which[-1])
        name = self._names[i] if self._names is not None else i
        return [provenance.Origin(i, int(keys[-1]), source=name)]


def set_mix_weights(
    it: DatasetIterator[Any], weights: Sequence[float] | Mapping[str, float]
) -> None:
    """`set_weights(weights)` on the one `IterDataset.mix` iterator of the pipeline that `it`
    iterates (found through `children()`), wherever it sits: under a `batch`, a `map`...

    >>> import chute
    >>> a = chute.MapDataset.range(100).to_iter_dataset()
    >>> b = chute.MapDataset.range(100, 200).to_iter_dataset()
    >>> it = iter(chute.IterDataset.mix([a, b]).batch(4))
    >>> next(it).tolist()
    [0, 100, 1, 101]
    >>> chute.experimental.set_mix_weights(it, [1, 3])
    >>> next(it).tolist()
    [2, 102, 103, 104]
    """
    found = [
        node for node in walk_iterators(it) if callable(getattr(type(node), "set_weights", None))
    ]
    if len(found) != 1:
        raise ValueError(
            f"set_mix_weights: the pipeline of {it!r} has {len(found)} mixtures with "
            "adjustable weights, not one: call set_weights on the mixture's own iterator "
            "(iter(mixture)) where there are several."
        )
    found[0].set_weights(weights)  # type: ignore[attr-defined]


def check_parents(datasets: Any, where: str) -> list[MapDataset[Any]]:
    parents = list(datasets)
    if not parents or not all(isinstance(d, MapDataset) for d in parents):
        raise TypeError(
            f"{where}: datasets={datasets!r} is invalid: pass a non-empty list of "
            "MapDatasets (use IterDataset.mix for IterDatasets)."
        )
    return parents


def gather(parents: Sequence[MapDataset[Any]], which: np.ndarray, keys: np.ndarray) -> list[Any]:
    """Elements `parents[which[j]][keys[j]]`, one `_getitems` call per parent."""
    out: list[Any] = [None] * len(which)
    for i in np.unique(which).tolist():
        sel = np.flatnonzero(which == i)
        for j, x in zip(sel.tolist(), parents[i]._getitems(keys[sel])):
            out[j] = x
    return out


class MixedMapDataset(MapDataset[Any]):
    """Interleaves datasets in the proportions of `weights`, deterministically.

    The mixture ends when its first dataset runs out (repeat the inputs first for an
    infinite mixture); shuffle the inputs first to shuffle it.

    >>> import chute
    >>> ds = chute.MapDataset.mix([chute.MapDataset.range(5), chute.MapDataset.range(7, 10)])
    >>> list(ds)
    [0, 7, 1, 8, 2, 9]
    >>> mixed = chute.MapDataset.mix(
    ...     [chute.MapDataset.range(100), chute.MapDataset.range(100, 200)], [3, 1])
    >>> sum(x >= 100 for x in mixed[:40])
    10
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(
        self,
        datasets: Sequence[MapDataset[Any]],
        weights: Sequence[float] | Callable[[int], Sequence[float]] | None,
        *,
        step_size: int = 1,
    ) -> None:
        parents = check_parents(datasets, "MapDataset.mix")
        super().__init__(parents)
        self._dynamic: StepCounts | None = None
        if callable(weights):
            lengths = [len(p) for p in parents]
            self._check_nonempty(lengths, parents)
            self._dynamic = StepCounts(
                Weights(weights, len(parents), "MapDataset.mix", step_size=step_size), lengths
            )
            return
        props = int_proportions(weights, len(parents), "MapDataset.mix")
        self._schedule = Schedule(props, "MapDataset.mix")
        # Grain's proportions before the gcd, which its repr shows.
        self._shown = tuple(grain_proportions(weights) if weights is not None else props)
        total = sum(props)
        lengths = [len(p) for p in parents]
        self._check_nonempty(lengths, parents)
        self._len = min(INFINITE, int(min(n / (p / total) for n, p in zip(lengths, props))))

    @staticmethod
    def _check_nonempty(lengths: list[int], parents: Sequence[MapDataset[Any]]) -> None:
        empty = [i for i, n in enumerate(lengths) if n == 0]
        if empty:
            named = ", ".join(f"index {i} ({parents[i]!r})" for i in empty)
            raise ValueError(
                f"MapDataset.mix: datasets {empty} are empty: every mixed dataset needs "
                "elements; leave empty ones out. (In Grain's words: All datasets must have "
                f"positive length for mixing, but dataset(s) at {named} have length 0.)"
            )

    def __len__(self) -> int:
        if self._dynamic is not None:
            return self._dynamic.length()
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        if self._dynamic is not None:
            which, keys = self._dynamic.locate(indices)
        else:
            which, keys = self._schedule.locate(indices)
        return gather(self._parents, which, keys)

    def _cache_identity(self) -> dict[str, Any]:
        if self._dynamic is not None:
            w = self._dynamic.weights
            return {"weights": w.fn, "step_size": w.step_size}
        return {"proportions": self._schedule.proportions}

    def __repr__(self) -> str:
        if self._dynamic is not None:
            w = self._dynamic.weights
            return f"MixedMapDataset(weights={w.fn!r}, step_size={w.step_size})"
        # Grain's words: the lengths of the inputs, and its selection map.
        return (
            f"MixedMapDataset(parent_lengths={[len(p) for p in self._parents]}, "
            f"selection_map=SelectionWithProportionsMap(proportions={self._shown}, "
            f"length={self._len}))"
        )

    def _fingerprint_params(self) -> str:
        if self._dynamic is not None:
            # The function is not part of what a state checks (as for a map's), so a run
            # may resume with a new one: it must give the same weights for the steps
            # before the restored position, which decided where each input is.
            return f"weights=function, step_size={self._dynamic.weights.step_size}"
        return str(self._schedule.proportions)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The input and its position, by the schedule it reads with (indices past the end
        are later epochs, as when read)."""
        at = np.asarray([position], dtype=np.int64)
        locate = self._dynamic.locate if self._dynamic is not None else self._schedule.locate
        which, keys = locate(at)
        return [provenance.Origin(int(which[0]), int(keys[0]), source=int(which[0]))]


class StepCounts:
    """Random access into a mixture whose weights are a function of the step: each input's
    count of positions before every step, summed once and kept."""

    def __init__(self, weights: Weights, lengths: list[int]) -> None:
        self.weights = weights
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self._starts: list[np.ndarray] = [np.zeros(len(lengths), dtype=np.int64)]
        self._len: int | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # worker processes sum again
        return {"weights": self.weights, "lengths": self.lengths}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["weights"], state["lengths"].tolist())  # type: ignore[misc]

    def _step(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The input of every position of `step`, and its rank among that input's positions
        in the step."""
        size = self.weights.step_size
        schedule = self.weights.compute(step)
        k = np.arange(step * size, (step + 1) * size, dtype=np.int64)
        which = schedule.which[k % schedule.period]
        ranks = np.empty(size, dtype=np.int64)
        for i in np.unique(which).tolist():
            sel = which == i
            ranks[sel] = np.arange(int(sel.sum()), dtype=np.int64)
        return which, ranks

    def start(self, step: int) -> np.ndarray:
        """Each input's count of positions before `step`."""
        starts = self._starts
        if step < len(starts):
            return starts[step]
        with self._lock:
            n = len(self.lengths)
            while len(starts) <= step:
                which, _ = self._step(len(starts) - 1)
                starts.append(starts[-1] + np.bincount(which, minlength=n))
            return starts[step]

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        size = self.weights.step_size
        steps = indices // size
        which = np.empty(len(indices), dtype=np.int64)
        keys = np.empty(len(indices), dtype=np.int64)
        for step in np.unique(steps).tolist():
            sel = np.flatnonzero(steps == step)
            w, ranks = self._step(step)
            offset = indices[sel] - step * size
            which[sel] = w[offset]
            keys[sel] = self.start(step)[w[offset]] + ranks[offset]
        return which, keys

    def length(self) -> int:
        """The first position whose input has run out (`INFINITE` if none can)."""
        if self._len is None:
            if (self.lengths >= INFINITE).all():
                self._len = INFINITE
            else:
                size, step = self.weights.step_size, 0
                while True:
                    w, ranks = self._step(step)
                    over = np.flatnonzero(self.start(step)[w] + ranks >= self.lengths[w])
                    if over.size:
                        self._len = step * size + int(over[0])
                        break
                    step += 1
        return self._len


class SelectFromDatasetsMapDataset(MapDataset[Any]):
    """Element `k` is `datasets[d][i]` where `(d, i) = selection_map[k]`; index
    `k + e * len(selection_map)` reads epoch `e` of `datasets[d]` there.

    >>> import chute
    >>> pick = [(1, 0), (0, 2), (1, 1)]
    >>> ds = chute.MapDataset.select_from_datasets(
    ...     [chute.MapDataset.range(3), chute.MapDataset.range(10, 12)], pick)
    >>> list(ds)
    [10, 2, 11]
    """

    _keeps_element_spec = True  # its elements are its first parent's

    def __init__(self, datasets: Sequence[MapDataset[Any]], selection_map: Any) -> None:
        parents = check_parents(datasets, "MapDataset.select_from_datasets")
        super().__init__(parents)
        if not (hasattr(selection_map, "__len__") and hasattr(selection_map, "__getitem__")):
            raise TypeError(
                f"MapDataset.select_from_datasets: selection_map={selection_map!r} is invalid: "
                "it must have __len__ and __getitem__(k) -> (dataset index, element index)."
            )
        self._map = selection_map
        self._len = len(selection_map)

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        if self._len == 0:
            raise IndexError(f"{self!r} is empty: there is no element {int(indices[0])} to read")
        epochs, pos = np.divmod(indices, self._len)
        pairs = [self._map[k] for k in pos.tolist()]
        n = len(self._parents)
        for k, (d, _) in zip(pos.tolist(), pairs):
            if not 0 <= d < n:
                raise IndexError(
                    f"select_from_datasets: selection_map[{k}] names dataset {d}, but there "
                    f"are {n}: dataset indices must be in [0, {n})."
                )
        which = np.fromiter((d for d, _ in pairs), dtype=np.int64, count=len(pairs))
        keys = np.fromiter((i for _, i in pairs), dtype=np.int64, count=len(pairs))
        if int(epochs.max()) > 0:  # epoch e reads epoch e of the selected datasets
            sizes = np.array([len(p) for p in self._parents], dtype=np.int64)
            keys = np.asarray(keys + epochs * sizes[which], dtype=np.int64)
        return gather(self._parents, which, keys)

    def __repr__(self) -> str:
        return f"SelectFromDatasetsMapDataset(selection_map={type(self._map).__name__})"

    def _fingerprint_params(self) -> str:
        return f"{type(self._map).__name__}, len={self._len}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The dataset and element `selection_map` names, as read: epoch `e` of the map
        reads epoch `e` of that dataset."""
        if self._len == 0:
            raise provenance.EndOfStream
        epoch, k = divmod(position, self._len)
        d, i = self._map[k]
        key = int(i) + epoch * len(self._parents[int(d)]) if epoch else int(i)
        return [provenance.Origin(int(d), key, source=int(d))]
