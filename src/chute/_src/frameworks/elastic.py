"""`ElasticIterator`: global batches over hosts, resumable with another host count.

Each host reads its own share of the global index order of `ds` (index `i` of a
`MapDataset` is position `i % len` of epoch `i // len`, so the order fixes what every
element is, whoever reads it). A layout is the list of indices still to read, `R =
explicit ++ [next_index, next_index + 1, ...)` below `len(ds)`; host `j` of `m` reads
`R[j::m]` in order, `host batch = global_batch_size // m` kept elements per step.

A host's state is what of `R[j::m]` it has not read: a short explicit list and an
arithmetic progression `next_index, next_index + m, ...`. With a `filter`, hosts read
different numbers of indices for the same number of batches, so one host's state does not
say where the others are; `merge_states` takes the states of all old hosts and returns
their union, the remaining indices, in the same compact form (an explicit list for the
indices between the slowest and the fastest host, then everything from a watermark on),
which any number of new hosts deal out round-robin. See docs/elastic.md. A merged state is
sealed with a checksum as host states are, and holds at most `MAX_MERGED_PENDING` explicit
indices: `merge_states` counts them before it lists them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core import contract, tree
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import DatasetIterator, ThreadGuardedIterator, check_int
from chute._src.core.options import MultiprocessingOptions, ReadOptions
from chute._src.core.seeding import same_params
from chute._src.core.state_checks import quote, seal, unseal
from chute._src.frameworks.sharding import ShardOptions

STAGE = "elastic"
MAX_MERGED_PENDING = 1 << 22
"""The most indices a merged state lists explicitly (those between the slowest and the
fastest old host): hosts of one run at one step are never that far apart."""
_RESTORE_FIX = (
    "restore each host from its own state when the host count is unchanged; with another "
    "host count, read the states of all old hosts and restore every new host from "
    "ElasticIterator.merge_states(states)"
)


class _HostIndicesMapDataset(MapDataset[Any]):
    """Position `p` of this host: `(p, ds[R_j[p]])`, or None where `ds` has None (filtered).

    `R_j = pending ++ [next_index, next_index + stride, ...)` below `stop`. The position
    travels with the element so that the iterator knows how far it has read after a batch
    whatever was filtered in between."""

    def __init__(
        self, parent: MapDataset[Any], pending: list[int], next_index: int, stride: int
    ) -> None:
        super().__init__([parent])
        self._pending = np.asarray(pending, dtype=np.int64)
        self._next, self._stride = next_index, stride
        stop = len(parent)
        tail = max(0, -(-(stop - next_index) // stride))
        self._len = len(pending) + tail

    def __len__(self) -> int:
        return self._len

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        k = len(self._pending)
        tail = self._next + (indices - k) * self._stride
        if k:
            explicit = self._pending[np.minimum(indices, k - 1)]
            source = np.where(indices < k, explicit, tail)
        else:
            source = tail
        xs = self._parents[0]._getitems(source)
        return [None if x is None else (p, x) for p, x in zip(indices.tolist(), xs)]

    def _fingerprint_params(self) -> str:
        return f"pending={len(self._pending)}, next={self._next}, stride={self._stride}"

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """The index of `R_j` at `position` (provenance: the element carries it)."""
        from chute._src.core.provenance import EndOfStream, same_position

        if position >= self._len:
            raise EndOfStream
        k = len(self._pending)
        index = (
            int(self._pending[position])
            if position < k
            else self._next + (position - k) * self._stride
        )
        return same_position(index)


def _stack_tagged(xs: list[tuple[int, Any]]) -> tuple[int, Any]:
    """A batch of `(position, element)`: the last position and the stacked elements."""
    return xs[-1][0], tree.stack([x for _, x in xs])


class _ElasticDatasetIterator(DatasetIterator[Any]):
    """One host's iterator: its state is its own remaining indices (module docstring)."""

    stage = STAGE

    def __init__(self, owner: ElasticIterator) -> None:
        super().__init__()
        self._owner = owner
        self._layout = (0, 0)  # (len(explicit), next_index) of the layout all hosts share
        self._pending: list[int] = []
        self._next = owner._shard.shard_index
        self._position = 0  # positions of R[j::m] read since the layout began
        self._read = 0  # positions read since `_pending`/`_next` were set
        self._step = 0
        self._inner: DatasetIterator[Any] | None = None

    def _iterator(self) -> DatasetIterator[Any]:
        if self._inner is None:
            o = self._owner
            host: MapDataset[Any] = _HostIndicesMapDataset(
                o._ds, self._pending, self._next, o._shard.shard_count
            )
            it = host.to_iter_dataset(o._read_options)
            if o._mp_options is not None:
                it = it.mp_prefetch(o._mp_options)
            batched = it.batch(o._host_batch_size, drop_remainder=True, batch_fn=_stack_tagged)
            self._inner = batched._iter()
        return self._inner

    def __next__(self) -> Any:
        last, batch = next(self._iterator())
        self._read = last + 1
        self._step += 1
        return batch

    def start_prefetch(self) -> None:
        self._iterator().start_prefetch()

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
            self._inner = None

    def _remaining(self) -> tuple[list[int], int]:
        k, m = len(self._pending), self._owner._shard.shard_count
        if self._read <= k:
            return self._pending[self._read :], self._next
        return [], self._next + (self._read - k) * m

    def get_state(self) -> dict[str, Any]:
        o = self._owner
        pending, next_index = self._remaining()
        return {
            "stage": STAGE,
            "pipeline": list(contract.identity(o._ds)),
            "stop": len(o._ds),
            "shard_index": o._shard.shard_index,
            "shard_count": o._shard.shard_count,
            "step": self._step,
            "pending": pending,
            "next_index": next_index,
            "position": self._position + self._read,
            "layout": list(self._layout),
            "may_filter": o._ds._may_be_none,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        o = self._owner
        j, m = o._shard.shard_index, o._shard.shard_count
        _check_common(state, o._ds, "state")
        if "merged_from" in state:
            explicit, start = _check_merged(state)
            pending = explicit[j::m]
            next_index = start + (j - len(explicit)) % m
            layout, position = (len(explicit), start), 0
        else:
            _check_host(state, "state")
            old_j, old_m = state["shard_index"], state["shard_count"]
            if (old_j, old_m) == (j, m):
                pending, next_index = state["pending"], state["next_index"]
                layout, position = (state["layout"][0], state["layout"][1]), state["position"]
            else:
                merged = _grain_style_global(state, j, m)
                explicit, start = _check_merged(merged)
                pending, next_index = [], start + j
                layout, position = (0, start), 0
        self.close()
        self._pending, self._next = list(pending), next_index
        self._layout, self._position, self._read = layout, position, 0
        self._step = check_int(state, "step", "state")


def _grain_style_global(state: dict[str, Any], j: int, m: int) -> dict[str, Any]:
    """Grain's way, one host's state for all new hosts: exact only when no host can have
    read more indices than another (no filter), so every old host is where this one is."""
    old_j, old_m = state["shard_index"], state["shard_count"]
    explicit_len, start = state["layout"]
    read = old_m * state["position"]  # indices of the layout every old host has read
    if state["may_filter"] or old_m == m or read < explicit_len:
        why = f"host {old_j} of {old_m}'s state was given to host {j} of {m}" + (
            "; its pipeline has a filter, so the other hosts may have read other numbers of indices"
            if state["may_filter"]
            else ""
        )
        raise CheckpointError(f"ElasticIterator: {why}: {_RESTORE_FIX}.")
    return {
        "stage": STAGE,
        "pipeline": state["pipeline"],
        "stop": state["stop"],
        "merged_from": old_m,
        "step": state["step"],
        "pending": [],
        "next_index": min(start + read - explicit_len, state["stop"]),
    }


def _check_common(state: Any, ds: MapDataset[Any], path: str) -> None:
    if not isinstance(state, dict) or state.get("stage") != STAGE:
        got = state.get("stage") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(
            f"{path}: {got!r} is not an ElasticIterator state (its 'stage' must be "
            f"{STAGE!r}); restore a state taken by ElasticIterator.get_state() or "
            "returned by ElasticIterator.merge_states()."
        )
    for key in ("pipeline", "stop", "step", "pending", "next_index"):
        if key not in state:
            raise CheckpointError(
                f"{path} has no {key!r}: the state is corrupt; restore a state taken by "
                "ElasticIterator.get_state() or returned by ElasticIterator.merge_states()."
            )
    recorded, identity = list(state["pipeline"]), list(contract.identity(ds))
    same = len(recorded) == len(identity) and all(map(same_params, recorded, identity))
    if not same or state["stop"] != len(ds):
        raise CheckpointError(
            f"{path}['pipeline'] = {state['pipeline']!r} (length {state['stop']!r}) is not "
            f"this dataset's {list(contract.identity(ds))!r} (length {len(ds)}): restore a state "
            "taken with the same dataset (same sources, seeds, slicing and stages)."
        )
    stop = check_int(state, "stop", path, hi=INFINITE)
    check_int(state, "next_index", path, hi=INFINITE)
    pending = state["pending"]
    if not isinstance(pending, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < stop for i in pending
    ):
        raise CheckpointError(
            f"{path}['pending'] must be a list of ints in [0, {stop}); the state is corrupt: "
            "restore a state taken by ElasticIterator.get_state()."
        )


def _check_host(state: dict[str, Any], path: str) -> None:
    for key in ("shard_index", "shard_count", "position", "layout", "may_filter"):
        if key not in state:
            raise CheckpointError(
                f"{path} has no {key!r}: it is neither one host's state nor a merged one; "
                "restore a state taken by ElasticIterator.get_state()."
            )
    m = check_int(state, "shard_count", path, lo=1)
    check_int(state, "shard_index", path, hi=m - 1)
    check_int(state, "position", path)
    layout, may_filter = state["layout"], state["may_filter"]
    if not (
        isinstance(layout, list)
        and len(layout) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in layout)
        and isinstance(may_filter, bool)
    ):
        raise CheckpointError(
            f"{path}['layout'] = {layout!r} / ['may_filter'] = {may_filter!r} is invalid: "
            "they must be two ints >= 0 and a bool; the state is corrupt: restore a state "
            "taken by ElasticIterator.get_state()."
        )


def _check_merged(state: dict[str, Any]) -> tuple[list[int], int]:
    explicit, start = list(state["pending"]), state["next_index"]
    if any(a >= b for a, b in itertools.pairwise(explicit)) or (explicit and explicit[-1] >= start):
        raise CheckpointError(
            "state['pending'] of a merged state must be increasing and below its "
            f"next_index={start}; the state is corrupt: restore what "
            "ElasticIterator.merge_states() returned."
        )
    return explicit, start


def merge_states(
    states: Sequence[dict[str, Any]], names: Sequence[str] | None = None
) -> dict[str, Any]:
    """The remaining indices of all old hosts, from all their states (see the class).

    `names[i]`, if given, says where `states[i]` came from (its file): an error about a
    state names it instead of `states[i]`."""
    states = list(states)
    if names is not None and len(names) != len(states):
        raise ValueError(
            f"ElasticIterator.merge_states got {len(states)} states and {len(names)} names: "
            "pass one name (the file it was read from) per state, or none."
        )

    def label(i: int) -> str:
        return f"{names[i]}: state" if names is not None else f"states[{i}]"

    if not states:
        raise ValueError(
            "ElasticIterator.merge_states got no states: pass the states of all hosts of "
            "the old run (one per process, e.g. the files process_{i}-of-{n}.json)."
        )
    for i, s in enumerate(states):
        s = states[i] = unseal(s, root=label(i))
        if not isinstance(s, dict) or s.get("stage") != STAGE or "merged_from" in s:
            raise CheckpointError(
                f"{label(i)} is not one host's ElasticIterator state: pass the states that "
                "each old host's ElasticIterator.get_state() returned."
            )
        _check_host(s, label(i))
        if not isinstance(s["pending"], list):
            raise CheckpointError(
                f"{label(i)}['pending'] = {quote(s['pending'])} is not a list of indices: "
                "the state is corrupt; pass the states each old host's "
                "ElasticIterator.get_state() returned."
            )
    first = states[0]
    m = first["shard_count"]
    for i, s in enumerate(states):
        for key in ("pipeline", "stop", "shard_count", "step", "layout"):
            if s.get(key) != first.get(key):
                raise CheckpointError(
                    f"{label(i)}[{key!r}] = {quote(s.get(key))} differs from {label(0)}'s "
                    f"{quote(first.get(key))}: the states must come from one checkpoint of one "
                    "run (same dataset, host count and step); pass the states all old hosts "
                    "saved at the same step."
                )
    seen = sorted(s["shard_index"] for s in states)
    # Compared with the count of states first: `m` is never expanded beyond them.
    if m != len(states) or seen != list(range(m)):
        shown = range(min(m, len(states) + 8))
        missing = f"{[j for j in shown if j not in seen]}"
        if m > len(shown):
            missing = f"{missing[:-1]}, ...] ({m - len(set(seen))} in all)"
        repeated = sorted({j for j in seen if seen.count(j) > 1})
        raise CheckpointError(
            f"ElasticIterator.merge_states: the states are of hosts {quote(seen)} of {m} "
            f"({label(0)}['shard_count']), missing {missing}, repeated {repeated}: every old "
            "host's state is needed exactly once (each host knows only what it has read "
            f"itself); pass all {m} states of the checkpoint."
        )
    stop = check_int(first, "stop", label(0), hi=INFINITE)
    for i, s in enumerate(states):
        check_int(s, "next_index", label(i), hi=INFINITE)
    explicit, high = union_of_remaining(
        [(s["pending"], s["next_index"]) for s in states],
        m,
        stop,
        who="ElasticIterator.merge_states",
        readers="hosts",
        fix="pass the states all old hosts saved at the same step",
        far_fix="(or restore with the same host count)",
        names=[label(i) for i in range(len(states))],
    )
    return seal(
        {
            "stage": STAGE,
            "pipeline": first["pipeline"],
            "stop": stop,
            "merged_from": m,
            "step": first["step"],
            "pending": explicit,
            "next_index": high,
        }
    )


# -- layouts, shared with chute.torch's elastic restore ------------------------------------------


def union_of_remaining(
    parts: Sequence[tuple[list[int], int]],
    stride: int,
    stop: int,
    *,
    who: str,
    readers: str,
    fix: str,
    far_fix: str = "",
    names: Sequence[str] | None = None,
) -> tuple[list[int], int]:
    """The indices of a layout that `stride` readers have not read, from what each has left:
    `parts[j] = (pending, next_index)`, its explicit list and then `next_index, next_index +
    stride, ...` below `stop`. Returned compactly: an increasing explicit list (the indices
    between the slowest and the fastest reader) and the index from which all are left.
    `CheckpointError` (naming `who`, the `readers` and the `fix`) when two readers' rests
    overlap or the list would be longer than `MAX_MERGED_PENDING` (counted before listed);
    `names[j]`, if given, says where part `j` came from, and a far one is named."""
    starts = [min(next_index, stop) for _, next_index in parts]
    if sorted(a % stride for a in starts if a < stop) != sorted(
        {a % stride for a in starts if a < stop}
    ):
        whose = ""
        if names:
            by_rest: dict[int, int] = {}
            for j, a in enumerate(starts):
                if a < stop and (k := by_rest.setdefault(a % stride, j)) != j:
                    whose = f" ({names[k]} and {names[j]})"
                    break
        raise CheckpointError(
            f"{who}: two {readers}{whose} read the same indices (next_index {quote(starts)}); the "
            f"states are corrupt or from different runs: {fix}."
        )
    high = max(starts)
    listed = sum(len(p) + -(-(high - a) // stride) for (p, _), a in zip(parts, starts))
    if listed > MAX_MERGED_PENDING:
        lo = starts.index(min(starts))
        hi = starts.index(high)
        whose = f" ({names[lo]} at {starts[lo]}, {names[hi]} at {high})" if names else ""
        raise CheckpointError(
            f"{who}: the {readers}' next_index values {quote(starts)}{whose} are "
            f"{high - min(starts)} indices apart, so the merged state would list {listed} "
            f"indices, more than {MAX_MERGED_PENDING}: {readers} of one run at one step are "
            f"never that far apart, so the states are corrupt or from different runs; {fix}"
            f"{' ' + far_fix if far_fix else ''}."
        )
    explicit: list[int] = []
    for (pending, _), a in zip(parts, starts):
        explicit.extend(pending)
        explicit.extend(range(a, high, stride))
    explicit.sort()
    return explicit, high


def share_of_layout(explicit: list[int], start: int, j: int, m: int) -> tuple[list[int], int]:
    """Reader `j` of `m`'s share of the layout `explicit ++ [start, start + 1, ...)`: its
    explicit list and where its progression (stride `m`) begins."""
    return explicit[j::m], start + (j - len(explicit)) % m


def rest_of_share(
    pending: list[int], next_index: int, stride: int, read: int
) -> tuple[list[int], int]:
    """What of a share (`pending`, then `next_index`, `next_index + stride`, ...) is left
    after its first `read` positions."""
    k = len(pending)
    if read <= k:
        return pending[read:], next_index
    return [], next_index + (read - k) * stride


def tagged_share(
    parent: MapDataset[Any], pending: list[int], next_index: int, stride: int
) -> MapDataset[Any]:
    """A reader's share of a layout of `parent`'s indices (below `len(parent)`), position
    `p` as `(p, parent[index])` (None where `parent` has None: filtered), so that a reader
    knows how many positions its last element or batch (`stack_tagged`) took."""
    return _HostIndicesMapDataset(parent, pending, next_index, stride)


def stack_tagged(xs: list[tuple[int, Any]]) -> tuple[int, Any]:
    """A batch of `(position, element)` pairs: the last position and the stacked elements."""
    return _stack_tagged(xs)


class ElasticIterator(IterDataset[Any]):
    """Global batches of `ds` over hosts, resumable with another host count.

    Host `shard_options.shard_index` of `shard_options.shard_count` gets batches of
    `global_batch_size // shard_count` elements; over all hosts, a step covers
    `global_batch_size` consecutive elements of the global index order of `ds` (filtered
    elements skipped), each element exactly once per epoch (a last partial batch of a host
    is dropped, as in Grain). With the same host count, each host restores its own state;
    with another, every new host restores `ElasticIterator.merge_states(old_states)`. A
    pipeline may contain `filter` (unlike Grain's). docs/elastic.md.

    >>> import chute
    >>> ds = chute.MapDataset.range(12).filter(lambda x: x % 3)
    >>> it = ElasticIterator(ds, 4, chute.sharding.ShardOptions(0, 2))
    >>> [b.tolist() for b in it]
    [[2, 4], [8, 10]]
    """

    def __init__(
        self,
        ds: MapDataset[Any],
        global_batch_size: int,
        shard_options: ShardOptions,
        *,
        read_options: ReadOptions | None = None,
        multiprocessing_options: MultiprocessingOptions | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(ds, MapDataset):
            raise TypeError(
                f"ElasticIterator got {ds!r}: it needs a MapDataset, unbatched and unsharded "
                "(positions must be addressable by global index); pass the dataset before "
                "to_iter_dataset(), batch() and sharding."
            )
        if not isinstance(shard_options, ShardOptions):
            raise TypeError(
                f"ElasticIterator: shard_options={shard_options!r} is not a ShardOptions: "
                "pass chute.sharding.ShardOptions(shard_index, shard_count) or "
                "ShardByJaxProcess()."
            )
        m = shard_options.shard_count
        if (
            isinstance(global_batch_size, bool)
            or not isinstance(global_batch_size, int)
            or global_batch_size <= 0
            or global_batch_size % m
        ):
            raise ValueError(
                f"ElasticIterator: global_batch_size={global_batch_size!r} is invalid: it "
                f"must be a positive multiple of shard_count={m} (each host gets "
                f"global_batch_size // shard_count elements a step); use e.g. "
                f"global_batch_size={m * max(1, _int_or_1(global_batch_size) // m)}."
            )
        self._ds = ds
        self._global_batch_size = global_batch_size
        self._host_batch_size = global_batch_size // m
        self._shard = shard_options
        self._read_options = read_options or ReadOptions()
        self._mp_options = multiprocessing_options
        self._default: DatasetIterator[Any] | None = None

    merge_states = staticmethod(merge_states)

    def _make_iterator(self) -> DatasetIterator[Any]:
        return _ElasticDatasetIterator(self)

    def __iter__(self) -> DatasetIterator[Any]:
        """The one iterator of this object (as in Grain, it is its own iterator)."""
        if self._default is None:
            self._default = ThreadGuardedIterator(self._iter())
            self._default.iterated = self  # what provenance reads the pipeline from
        return self._default

    def __next__(self) -> Any:
        return next(iter(self))

    def get_state(self) -> dict[str, Any]:
        return iter(self).get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        iter(self).set_state(state)

    def start_prefetch(self) -> None:
        iter(self).start_prefetch()

    def close(self) -> None:
        if self._default is not None:
            self._default.close()

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """This host's batch `position` of a run from the start: the elements of its share
        of `ds`'s index order (`shard_index::shard_count`, filtered ones skipped), in
        batches of `global_batch_size // shard_count` (provenance, from positions)."""
        from chute._src.core.provenance import as_records

        memo = tracer.memo(self)
        if "host" not in memo:
            j, m = self._shard.shard_index, self._shard.shard_count
            share = tagged_share(self._ds, [], j, m).to_iter_dataset()
            memo["host"] = share.batch(self._host_batch_size, drop_remainder=True)
        return as_records(memo["host"], position, tracer)

    def __repr__(self) -> str:
        return (
            f"ElasticIterator(global_batch_size={self._global_batch_size}, "
            f"shard={self._shard.shard_index}/{self._shard.shard_count})"
        )


def _int_or_1(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else 1
