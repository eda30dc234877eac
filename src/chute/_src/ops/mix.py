"""`IterDataset.mix`: interleave iterable datasets in given proportions, deterministically.

The schedule is Grain's (see `chute._src.ops.mixing`): position `k` of the mixture comes from
a dataset fixed by `k` and the weights alone, so the output never depends on timing or
workers. The state is the position and each component's own state, keyed by name when the
components are given as a dict: such a mixture can be restored after its weights changed
or components were added (a new component starts from its beginning).

Weights may change during a run: a function of the step (`weights(step)`, with `step =
position // step_size`), or `set_weights` on the iterator between steps. Position `k` is
drawn from the schedule of the weights in force at `k`, at `k % period`
(`mixing.Weights`), so no history is needed to continue: a mixture with a function keeps
the state of a fixed one (the function gives the weights at the restored position), and
after `set_weights` the state also records the weights set (`"weights"`), so that it
restores to the same future draws.

`MapDataset.mix` and `MapDataset.select_from_datasets`: random access into a mixture.

With weights that are a function of the step (`weights(step)`, `step = position //
step_size`), position `k` is drawn from the schedule of its step's weights at `k % period`
(`mixing.Weights`), and its element in that input is the input's count of positions
before `k`: the counts at the start of each step are summed step by step once (kept, a few
integers per step) up to the furthest step asked for.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import (
    DatasetIterator,
    bad_value,
    check_int,
    check_state,
    int_at,
    walk_iterators,
)
from chute._src.core.state_checks import quote
from chute._src.core.transforms import describe
from chute._src.ops.mix_schedule import NEVER, ChangeLog
from chute._src.ops.mixing import Schedule, Weights, grain_proportions, int_proportions


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
        return _MixIterator([self._parent_iter(i) for i in range(len(self._parents))], self)

    def _cache_identity(self) -> dict[str, Any]:
        w = self._weights
        weights: Any = w.fn if w.fn is not None else w.at_step(0).proportions
        return {"names": self._names, "weights": weights, "step_size": w.step_size}

    def __repr__(self) -> str:
        w = self._weights
        if w.fn is not None:
            return f"MixedIterDataset(weights={describe(w.fn)}, step_size={w.step_size})"
        return f"MixedIterDataset(proportions={list(w.at_step(0).proportions)})"


class _MixIterator(DatasetIterator[Any]):
    stage = "mix"

    def __init__(self, parents: list[DatasetIterator[Any]], ds: MixedIterDataset) -> None:
        super().__init__(parents)
        self._parents = parents
        self._names = ds._names
        self._weights = copy.copy(ds._weights)  # its memo of the current step is this one's
        # The weights in force at `_index` when given at run time (as the state records
        # them, and their schedule), or None for the weights the mixture was built with.
        self._set: tuple[Any, Schedule] | None = None
        self._fixed = self._schedule_for_every_step()
        self._log = ChangeLog()  # every change given at run time, by position
        self._due = NEVER  # the position of the next change the log holds
        # One draw, a change, or a state at a time (a prefetching stage draws in a thread
        # of its own while the consumer's thread changes the weights).
        self._lock = threading.RLock()  # reentrant: a function drawn from may set weights
        self._initial = [p.get_state() for p in parents]
        self._index = 0

    def _schedule_for_every_step(self) -> Schedule | None:
        """The schedule in force whatever the step (weights set, or fixed ones), or None
        when a function of the step gives it."""
        if self._set is not None:
            return self._set[1]
        return None if self._weights.dynamic else self._weights.at_step(0)

    def set_weights(self, weights: Sequence[float] | Mapping[str, float]) -> None:
        """Draws the positions from the next one on with `weights` (a list, or a dict by
        name for a mixture given as a dict), instead of the weights it was built with or
        its function of the step, until the next call. A weight of 0 draws nothing from
        its input while it holds; at least one must be positive.

        The change is recorded with the position it is made at (docs/sequences.md), in
        the state too, so that a state taken after the call restores the same draws, even
        where a stage above replays the mixture from an earlier position. A stage between
        this iterator and the consumer that computes ahead (prefetching, a window) has
        drawn its buffered elements with the weights before."""
        self._weights.schedule_of(weights, ", set_weights", allow_zero=True)  # checked now
        values = self._weights.as_list(weights)
        assert values is not None
        recorded: Any = [float(w) for w in values]
        if self._names is not None:
            recorded = dict(zip(self._names, recorded))
        with self._lock:
            self._log.record(self._index, recorded)
            self._make(recorded)
            self._due = NEVER  # later changes the log held are replaced by this one

    def _make(self, recorded: Any) -> None:
        """Puts the weights `recorded` (checked) in force."""
        self._set = (recorded, self._weights.schedule_of(recorded, allow_zero=True))
        self._fixed = self._set[1]

    def _make_due(self) -> None:
        """Puts the change the log holds at `_index` in force."""
        k = self._index
        self._make(self._log.at(k))
        self._due = self._log.due_after(k)

    def _which(self, indices: np.ndarray) -> np.ndarray:
        if self._set is not None:
            return self._set[1].locate(indices)[0]
        return self._weights.which(indices)

    def __next__(self) -> Any:
        with self._lock:
            k = self._index
            if k == self._due:
                self._make_due()
            schedule = self._fixed
            if schedule is None:
                schedule = self._weights.at_step(k // self._weights.step_size)
            x = next(self._parents[int(schedule.which[k % schedule.period])])
            self._index = k + 1
            return x

    def _next_many(self, n: int) -> list[Any]:
        out: list[Any] = []
        with self._lock:
            while n > 0:
                if self._index == self._due:
                    self._make_due()
                m = min(n, self._due - self._index)
                got = self._draw(m)
                out.extend(got)
                if len(got) < m:
                    break
                n -= m
        return out

    def _draw(self, n: int) -> list[Any]:
        """The next `n` elements (fewer where an input ends), with the weights in force."""
        which = self._which(np.arange(self._index, self._index + n, dtype=np.int64))
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
        with self._lock:
            states = [p.get_state() for p in self._parents]
            parents: Any = states if self._names is None else dict(zip(self._names, states))
            state = {"stage": self.stage, "index": self._index, "parents": parents}
            if self._set is not None:
                state["weights"] = copy.copy(self._set[0])
            if self._log:
                state["changes"] = self._log.as_state()
            return state

    def _catch_up(self, state: Any) -> Any:
        index = int_at(state, "index")
        if not isinstance(state, dict) or state.get("stage") != self.stage or index is None:
            return state
        out = state
        parents = state.get("parents")
        if self._names is None and isinstance(parents, list) and len(parents) == len(self._parents):
            news = [p._catch_up(s) for p, s in zip(self._parents, parents)]
            if any(a is not b for a, b in zip(news, parents)):
                out = {**state, "parents": news}
        elif self._names is not None and isinstance(parents, dict):
            named = {
                n: p._catch_up(parents[n])
                for n, p in zip(self._names, self._parents)
                if n in parents
            }
            if any(named[n] is not parents[n] for n in named):
                out = {**state, "parents": {**parents, **named}}
        with self._lock:
            if not self._log and "changes" not in state:
                return out
            return self._log.catch_up(out, index)

    def _count_at(self, state: Any) -> int | None:
        return int_at(state, "index")

    def _restore(self, state: Any, path: str) -> None:
        keys = {"stage", "index", "parents"}
        if isinstance(state, dict):
            keys |= {"weights", "changes"} & set(state)
        check_state(state, self.stage, keys, path)
        index = check_int(state, "index", path)
        chosen = self._weights_of(state, path)
        log = ChangeLog()
        if "changes" in state:
            log = ChangeLog.from_state(state["changes"], f"{path}['changes']", self._check_weights)
        if chosen is None and log.in_force(index) is not None:
            recorded = log.in_force(index)
            chosen = (recorded, self._weights.schedule_of(recorded, allow_zero=True))
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
            if chosen is None and not self._weights.dynamic:
                # With weights that changed, the inputs' shares of the positions before
                # `index` are not known here: the check is for a fixed schedule only.
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
        with self._lock:
            self._index = index
            self._set = chosen
            self._fixed = self._schedule_for_every_step()
            self._log = log
            self._due = log.due_after(index)

    def _check_weights(self, recorded: Any, where: str) -> None:
        try:
            self._weights.schedule_of(recorded, allow_zero=True)
        except (TypeError, ValueError) as e:
            raise CheckpointError(
                f"{where} = {quote(recorded)} is invalid: {e} The state records the weights "
                "given to set_weights; restore a state taken by get_state() of this mixture."
            ) from None

    def _weights_of(self, state: dict[str, Any], path: str) -> tuple[Any, Schedule] | None:
        """The weights a state records as in force (set with `set_weights`), checked; None
        if none."""
        if "weights" not in state:
            return None
        recorded = state["weights"]
        self._check_weights(recorded, f"{path}['weights']")
        return recorded, self._weights.schedule_of(recorded, allow_zero=True)

    def _check_index(self, index: int, parents: list[Any], path: str) -> None:
        """`index` against the inputs' positions: the schedule gives each input its share
        of the first `index` positions, so each input has handed out at least that many
        (more only when another input ran out in the middle of a block)."""
        sched = self._weights.at_step(0)
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
