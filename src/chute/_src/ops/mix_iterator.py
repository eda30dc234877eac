"""The iterator of `IterDataset.mix`: draws by Grain's schedule, weights set between steps.

Position `k` is drawn from the schedule of the weights in force at `k`, at `k % period`
(`mixing.Weights`), so no history is needed to continue: a mixture with a function of the
step keeps the state of a fixed one (the function gives the weights at the restored
position). Weights given between steps (`set_weights`) are recorded by the position they
are made at (`mix_schedule.ChangeLog`): the state carries that schedule (`"changes"`) and
the weights in force at its position (`"weights"`), so a replay from an earlier position
(a window, a prefetch buffer, an epoch's start) makes each change where it was made.

A mixture that has ended (an input ran out) stays ended, as Python's iterator protocol
asks: weights given after its end do not revive it. The end is history too: the state
records the position it ended at (`"ended"`), brought into older states as the changes
are, so a replay from an earlier position ends there as the run did, whatever was
changed after (an `IterDataset.cache()` that reads its pass again, a packer's window); it
is in the state once a change was made at or after it. A change made before that position
(a replay not there yet) rewrites what follows it, the end included.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import (
    MAX_POSITION,
    DatasetIterator,
    bad_value,
    check_int,
    check_state,
    int_at,
)
from chute._src.core.state_checks import quote
from chute._src.ops.mix_schedule import NEVER, ChangeLog, Schedule, Weights


class MixIterator(DatasetIterator[Any]):
    stage = "mix"

    def __init__(
        self, parents: list[DatasetIterator[Any]], names: list[str] | None, weights: Weights
    ) -> None:
        super().__init__(parents)
        self._parents = parents
        self._names = names
        self._weights = copy.copy(weights)  # its memo of the current step is this one's
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
        self._ended = NEVER  # the position it ended at (an input ran out), or NEVER

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
            if self._index < self._ended:  # so is a later end (a replay not there yet)
                self._ended = NEVER

    def weight_changes(self) -> tuple[list[tuple[int, Any]], int]:
        """The weights given at run time, each with the position from which it holds, and
        the position of the latest change the bounded schedule forgot (-1: none): what
        `chute.experimental.provenance` draws with."""
        with self._lock:
            log = self._log
            return list(zip(log.positions, log.weights)), log.forgotten

    def schedule_weight_changes(self, changes: list[tuple[int, Any]]) -> None:
        """Makes the weight changes of another run of this mixture (its `weight_changes()`),
        each at its position, as a restored schedule does: what provenance does to the
        iterators it reads a mixture through, so that they draw as the run did."""
        log = ChangeLog()
        for position, weights in changes:
            log.record(position, weights)
        with self._lock:
            recorded = log.in_force(self._index)
            if recorded is not None:
                self._make(recorded)
            self._log = log
            self._due = log.due_after(self._index)

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
            if k >= self._ended:
                raise StopIteration
            if k == self._due:
                self._make_due()
            schedule = self._fixed
            if schedule is None:
                schedule = self._weights.at_step(k // self._weights.step_size)
            try:
                x = next(self._parents[int(schedule.which[k % schedule.period])])
            except StopIteration:
                self._ended = k
                raise
            self._index = k + 1
            return x

    def _next_many(self, n: int) -> list[Any]:
        out: list[Any] = []
        with self._lock:
            while n > 0 and self._index < self._ended:
                if self._index == self._due:
                    self._make_due()
                m = min(n, self._due - self._index, self._ended - self._index)
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
        if end < n:
            self._ended = self._index
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
            if self._end_is_history():
                state["ended"] = self._ended
            return state

    def _end_is_history(self) -> bool:
        """Whether a replay needs to be told where the mixture ended: a change was made
        at or after its end (without one, a replay ends there by itself; and a state
        keeps its shape until weights are set)."""
        log = self._log
        return self._ended != NEVER and bool(log) and log.positions[-1] >= self._ended

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
            if self._log or "changes" in state:
                out = self._log.catch_up(out, index)
            if self._end_is_history() and index <= self._ended and "ended" not in out:
                out = {**out, "ended": self._ended}  # where a replay from there ends
            return out

    def _count_at(self, state: Any) -> int | None:
        return int_at(state, "index")

    def _restore(self, state: Any, path: str) -> None:
        keys = {"stage", "index", "parents"}
        if isinstance(state, dict):
            keys |= {"weights", "changes", "ended"} & set(state)
        check_state(state, self.stage, keys, path)
        index = check_int(state, "index", path)
        ended = NEVER
        if "ended" in state:
            ended = check_int(
                state,
                "ended",
                path,
                index,
                MAX_POSITION,
                "where the mixture ended, at or after 'index'",
            )
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
            self._ended = ended

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
