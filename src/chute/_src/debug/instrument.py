"""Debug-mode instrumentation: a timing proxy around every stage, built with the iterator.

This is the debug layer: it depends on the engine, never the reverse. It plugs in through
the engine's observer hook (`_src/core/observe.py`): importing this module installs
`DebugObserver`, and `chute.config` loads it (the `chute` package registers the loader,
which imports `_src/debug/stats.py`) when a debug option is switched on. Only when
`chute.config` asks for it (`py_debug_mode`, or a visualization directory) does the engine
hand iterators over to it; otherwise nothing here runs (or is even imported), and a
pipeline pays nothing for it. Instrumented:

- every IterDataset stage's iterator is wrapped in a `TimedIterator` (state, prefetch and
  close pass straight through, so checkpoints are unchanged);
- the MapDataset under a `to_iter_dataset` is rebuilt (`rewrite`) with a
  `_TimedMapDataset` around every node, timing each block call and counting what it
  produced (a filter's rejects, `None`, are not elements); in worker processes the same
  copy runs, and the figures travel back with every chunk and are merged;
- a shard of a stream read in a worker process (`mp_prefetch`) is sent as a `_TimedShard`,
  whose records, one per stage of the shard, are made here; the worker's iterators of
  those stages take them, and their figures travel back with each shard request;
- a sampler thread wakes every few milliseconds and notes, for the stage each thread is in,
  whether it had to wait for the GIL: a wait means some thread was running Python code
  (GIL held); no wait means the work was in code that released the GIL.

It finds its way through the stage contract only (`core/contract.py`: parents, role,
concurrency, whether the engine inserted a stage, and rebuilding on other parents, on
datasets; `children()` and `computed_dataset()` on iterators). Each record carries the
stage's `role`, its kind (`stage_kind`: what metrics label it by), whether it is a
pass-through (a seed, `mp_prefetch` with no workers: never named the bottleneck) and
whether it is `internal` (a stage the engine put in: the summary hides it). A stand-in
for work done elsewhere (a stage moved into workers, a shard read in one) names that work
(`_stands_for`: a node of which a timed copy was made); its record lists that copy's
records (`stands_for`), which the figures show in the stand-in's place (`stats.py`).
"""

from __future__ import annotations

import itertools
import operator
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from chute._src.core import config, contract, observe
from chute._src.core.columns import Columns
from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset, MapDataset, rewrite, walk
from chute._src.core.iterator import DatasetIterator, walk_iterators
from chute._src.core.machine import thread_times_ns
from chute._src.debug import handout
from chute._src.debug.records import StageRecord

_get_ident = threading.get_ident
_perf_counter_ns = time.perf_counter_ns

# -- which stage each thread is in, for the GIL sampler ------------------------------------

_stacks: dict[int, list[tuple[StageRecord, int]]] = {}  # thread -> (stage, entered at ns)
_sampler_lock = threading.Lock()
_sampler: threading.Thread | None = None
_SAMPLE_S = 0.004
_BUSY_S = 0.002  # the GIL took this long to come back: a thread running Python code had it


def _stack() -> list[tuple[StageRecord, int]]:
    tid = threading.get_ident()
    stack = _stacks.get(tid)
    if stack is None:
        stack = _stacks[tid] = []
    return stack


def _sample_forever() -> None:
    """Each sample notes, for the stage every thread is in, whether another thread held the
    GIL (it was running Python code) or not (its work released it): this thread sleeps
    `_SAMPLE_S` without the GIL, and on waking takes it back, at once if no thread holds
    it, else after the holder's switch interval (5 ms). Of the time past the sleep, the
    time spent queued for a CPU (a loaded machine; Linux reports it, elsewhere it counts
    as held) is left out, so that load does not read as a held GIL. Samples fall where the
    GIL changes hands, so they are a rough measure; the advice leans first on CPU time."""
    sample_ns, busy_ns = int(_SAMPLE_S * 1e9), int(_BUSY_S * 1e9)
    while True:
        _, q0 = thread_times_ns()
        t0 = time.perf_counter_ns()
        time.sleep(_SAMPLE_S)  # lets go of the GIL, and takes it back on waking
        late = time.perf_counter_ns() - t0 - sample_ns
        _, q1 = thread_times_ns()
        busy = late - (q1 - q0) > busy_ns
        for stack in list(_stacks.values()):
            if stack:
                record = stack[-1][0]
                record.samples += 1
                record.gil_busy += busy


def ensure_sampler() -> None:
    """Starts this process's GIL sampler thread, once."""
    global _sampler
    with _sampler_lock:
        if _sampler is None:
            _sampler = threading.Thread(
                target=_sample_forever, name="chute-gil-sampler", daemon=True
            )
            _sampler.start()


def _timed(record: StageRecord, fn: Any, *args: Any) -> tuple[Any, int, tuple[int, int]]:
    """`fn(*args)` (a block of elements), its wall time and its thread's time on a CPU and
    queued for one (read on every call: ~1 us, small beside a block)."""
    stack = _stack()
    c0, q0 = thread_times_ns()
    t0 = time.perf_counter_ns()
    stack.append((record, t0))
    try:
        out = fn(*args)
    finally:
        wall = time.perf_counter_ns() - t0
        stack.pop()
    c1, q1 = thread_times_ns()
    return out, wall, (c1 - c0, q1 - q0)


# -- MapDataset side ----------------------------------------------------------------------


class _TimedMapDataset(MapDataset[Any]):
    """Times `_getitems` of the node it wraps (inclusive of the node's timed parents)."""

    _role = StageRole.PASS_THROUGH

    def __init__(self, inner: MapDataset[Any], record: StageRecord, read: bool = True) -> None:
        super().__init__([inner])
        self.record = record
        # Read by a `to_iter_dataset` reader: its elements count as the reader hands them
        # out (`handout.py`); else (a shard's moved stages) as they are computed.
        self.read = read

    @property
    def inner(self) -> MapDataset[Any]:
        return self._parents[0]

    @property
    def _fingerprint(self) -> str:
        return contract.fingerprint(self.inner)

    def __len__(self) -> int:
        return len(self.inner)

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        if not self.read:
            out, wall, cpu = _timed(self.record, self._parents[0]._getitems, indices)
            self.record.add(len(out) - sum(map(operator.is_, out, _NONES)), wall, cpu)
            self._note_spec(out)
            return out
        call, outermost = handout.enter(self.record, len(indices))
        produced = None
        try:
            out, wall, cpu = _timed(self.record, self._parents[0]._getitems, indices)
            # What the node produced: a filter's rejects (None, holes in the index space)
            # are not elements, as they are not for the same filter run on the stream.
            produced = np.fromiter(map(operator.is_not, out, _NONES), bool, len(out))
        finally:
            handout.leave(call, produced, indices, outermost)
        # Counted as the reader hands the elements out (`handout.py`), not when computed.
        self.record.add(int(produced.sum()), wall, cpu, counted=False)
        self._note_spec(out)
        return out

    def _note_spec(self, out: list[Any]) -> None:
        if self.record.spec is None:
            first = next((x for x in out if x is not None), None)
            if first is not None:
                self.record.spec = element_spec(first)

    def __repr__(self) -> str:
        return repr(self.inner)


_NONES = itertools.repeat(None)

# The records of each node that a timed copy was made of, in this process, by the node's
# id while it lives: how a stand-in (`_stands_for`) finds the records that take its place.
_timed_as: dict[int, tuple[weakref.ref[Any], list[StageRecord]]] = {}


def _note_timed(node: Any, records: list[StageRecord]) -> None:
    key = id(node)
    _timed_as[key] = (weakref.ref(node, lambda _: _timed_as.pop(key, None)), records)


def records_of(node: Any) -> list[StageRecord] | None:
    """The records of the timed copy made of `node` (the one in its place first), if any."""
    found = _timed_as.get(id(node))
    return found[1] if found is not None and found[0]() is node else None


def stage_kind(node: Any) -> str:
    """What metrics call a stage: its kind, as the checkpoint's `"pipeline"` names it (the
    class less its `MapDataset`/`IterDataset` suffix), the same wherever it runs and never
    a file, a line or a function."""
    name = type(node).__name__.lstrip("_")
    for suffix in ("MapDataset", "IterDataset"):
        if name.endswith(suffix) and name != suffix:
            return name[: -len(suffix)]
    return name


def _map_record(node: MapDataset[Any], original: MapDataset[Any], inputs: list[int]) -> StageRecord:
    # A map/filter moved into workers from the stream is named as the user wrote it.
    name = getattr(original, "_moved_from", None) or repr(node)
    record = StageRecord(
        name, "map", inputs, role=contract.role(node), internal=contract.is_internal(node)
    )
    record.stage = stage_kind(node)
    return record


def timed_map_chain(ds: MapDataset[Any], read: bool = True) -> MapDataset[Any]:
    """A copy of `ds` with every node timed; same elements, same fingerprint. Each node of
    `ds` is noted as timed by its record (`records_of`), for the stand-ins of moved
    stages. `read`: read by a reader, whose hand-outs count its elements."""
    originals = iter(walk(ds))  # `rewrite` hands the nodes over in the walk's order

    def timed(node: MapDataset[Any]) -> MapDataset[Any]:
        original = next(originals)
        inputs = [cast(_TimedMapDataset, p).record.id for p in node.parents]
        record = _map_record(node, original, inputs)
        if type(original) is type(node):
            _note_timed(original, [record])
        return _TimedMapDataset(node, record, read)

    return rewrite(ds, timed)


def map_records(ds: Any) -> list[StageRecord]:
    """The records of a timed map chain, or of a shard timed for a worker, sources first."""
    if ds is None:
        return []
    out: list[StageRecord] = []
    for n in walk(ds):
        if isinstance(n, _TimedMapDataset):
            out.append(n.record)
        elif isinstance(n, _TimedShard):
            out.extend(n.records)
    return out


# -- shards read in worker processes --------------------------------------------------------


class _TimedShard(IterDataset[Any]):
    """A shard of a stream as a worker reads it, its stages timed: the records are made
    here (in the main process, so their figures merge back by id), one per stage of the
    shard, and the worker's iterators of the same stages take them (`_preset`)."""

    _role = StageRole.SOURCE
    _internal = True

    def __init__(self, inner: IterDataset[Any]) -> None:
        super().__init__()
        self.inner = inner
        index: dict[int, StageRecord] = {}
        self.records: list[StageRecord] = []
        for node in walk(inner):
            record = StageRecord(
                repr(node),
                "iter",
                [index[id(p)].id for p in node.parents],
                boundary=contract.is_concurrent(node),
                role=contract.role(node),
                internal=contract.is_internal(node),
            )
            record.stage = stage_kind(node)
            index[id(node)] = record
            self.records.append(record)
        _note_timed(inner, [self.records[-1], *self.records[:-1]])

    def _make_iterator(self) -> DatasetIterator[Any]:
        before = getattr(_preset, "records", None)
        _preset.records = {id(n): r for n, r in zip(walk(self.inner), self.records)}
        try:
            with config.debug_mode_here():  # the shard's stages are built timed, here too
                return self.inner._iter()
        finally:
            _preset.records = before

    def __repr__(self) -> str:
        return repr(self.inner)


_preset = threading.local()  # .records: id(stage) -> the record its iterator takes


# -- IterDataset side ---------------------------------------------------------------------


class TimedIterator(DatasetIterator[Any]):
    """Times its stage's iterator. Not a stage itself: the state is the inner one's."""

    def __init__(self, inner: DatasetIterator[Any], record: StageRecord) -> None:
        super().__init__(inner)
        self._inner = inner
        self.record = record
        # Set on the outermost proxy: what prints summaries; it gets `last_ns` (when the
        # consumer got its latest element) and `tick()` calls.
        self.top: Any = None
        # A reader's: the position it started handing out from (0, or where restored).
        at = inner.handed_out_to()
        self._reads = at is not None
        self._from = at or 0

    @property
    def inner(self) -> DatasetIterator[Any]:
        return self._inner

    def __next__(self) -> Any:
        # `_timed` inlined: this runs once per element per stage in debug mode.
        record = self.record
        stack = _stacks.get(_get_ident()) or _stack()
        read_cpu = not record.calls & 15
        c0, q0 = thread_times_ns() if read_cpu else (0, 0)
        t0 = _perf_counter_ns()
        stack.append((record, t0))
        try:
            x = self._inner.__next__()
        except StopIteration:
            stack.pop()
            if self.top is not None:
                self.top.finished()
            raise
        except BaseException:
            stack.pop()
            raise
        wall = _perf_counter_ns() - t0
        stack.pop()
        record.calls += 1
        record.elements += 1
        record.wall_ns += wall
        if wall < record.min_ns:
            record.min_ns = wall
        if wall > record.max_ns:
            record.max_ns = wall
        if read_cpu:
            c1, q1 = thread_times_ns()
            record.add_cpu(wall, c1 - c0, q1 - q0)
        if record.spec is None:
            record.spec = element_spec(x)
        if self._reads and not record.calls & 1023:
            self.settle()  # keeps the blocks waiting to be credited few
        top = self.top
        if top is not None:
            top.last_ns = t0 + wall  # the consumer's clock: when it got its latest element
            if record.calls == 1 or not record.calls & 63:
                top.tick()
        return x

    def _next_many(self, n: int) -> list[Any]:
        xs, wall, cpu = _timed(self.record, self._inner._next_many, n)
        self.record.add(len(xs), wall, cpu)
        if self._reads and not self.record.calls & 15:
            self.settle()
        if self.record.spec is None and xs:
            self.record.spec = element_spec(xs[0])
        return xs

    def _next_columns(self, n: int) -> list[Any] | Columns:
        xs, wall, cpu = _timed(self.record, self._inner._next_columns, n)
        self.record.add(len(xs), wall, cpu)
        if self._reads and not self.record.calls & 15:
            self.settle()
        if self.record.spec is None and xs:
            self.record.spec = element_spec(xs[0])
        return xs

    def get_state(self) -> dict[str, Any]:
        return self._inner.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self.settle()
        try:
            self._inner.set_state(state)
        finally:
            self._restarted()

    def _restore(self, state: Any, path: str) -> None:
        self.settle()
        try:
            self._inner._restore(state, path)
        finally:
            self._restarted()

    def settle(self) -> None:
        """A reader's: credits its chain's elements handed out so far (`handout.py`)."""
        at = self._inner.handed_out_to()
        if at is not None:
            handout.settle(map_records(self._inner.computed_dataset()), self._from, at)

    def _restarted(self) -> None:
        """After a restore: what the chain computed ahead is not handed out from here."""
        at = self._inner.handed_out_to()
        if at is not None:
            handout.drop(map_records(self._inner.computed_dataset()))
            self._from = at

    def handed_out_to(self) -> int | None:
        return self._inner.handed_out_to()

    def start_prefetch(self) -> None:
        self._inner.start_prefetch()

    def close(self) -> None:
        self.settle()
        if self.top is not None:
            self.top.finished()
        self._inner.close()


_depth = threading.local()


def instrumented_iter(
    ds: IterDataset[Any], make: Callable[[], DatasetIterator[Any]]
) -> DatasetIterator[Any]:
    """`iter(ds)` with every stage timed (`make()` builds the stage's own iterator); the
    outermost call attaches the pipeline view."""
    level = getattr(_depth, "level", 0)
    _depth.level = level + 1
    try:
        inner = make()
    finally:
        _depth.level = level
    preset: dict[int, StageRecord] | None = getattr(_preset, "records", None)
    record = preset.get(id(ds)) if preset is not None else None
    if record is None:
        record = StageRecord(
            repr(ds),
            "iter",
            _input_ids(inner),
            boundary=contract.is_concurrent(ds),
            role=contract.role(ds),
            internal=contract.is_internal(ds),
        )
        record.stage = stage_kind(ds)
        # A stand-in for work done elsewhere (a stage moved into workers, a shard read in
        # one): the records of that work take its place in the figures.
        stands_for = getattr(ds, "_stands_for", None)
        if stands_for is not None:
            record.stands_for = records_of(stands_for)
    proxy = TimedIterator(inner, record)
    if level == 0 and preset is None:
        if config.get("py_debug_mode"):
            ensure_sampler()
        if _view_factory is not None:
            proxy.top = _view_factory(proxy)
    return proxy


_view_factory: Callable[[TimedIterator], Any] | None = None


def attach_view(factory: Callable[[TimedIterator], Any]) -> None:
    """Where the debug summary plugs in: `factory(top)` is built for the outermost timed
    iterator and kept as `top.top` (it gets `tick()` and `finished()` calls, and its
    `last_ns` is set to when the consumer got each element)."""
    global _view_factory
    _view_factory = factory


def _input_ids(it: DatasetIterator[Any]) -> list[int]:
    return [r.id for r in nearest_records(it)]


def nearest_records(it: DatasetIterator[Any]) -> list[StageRecord]:
    """The records of the stages feeding iterator `it`: the nearest proxies or map chains."""
    found: list[StageRecord] = []
    queue = list(it.children())
    seen: set[int] = set()
    while queue:
        node = queue.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, TimedIterator):
            found.append(node.record)
            continue
        chain = map_records(node.computed_dataset())
        if chain:
            found.append(chain[-1])
        else:
            queue.extend(node.children())
    chain = map_records(it.computed_dataset())
    if chain:
        found.append(chain[-1])
    return found


def stage_records(
    top: DatasetIterator[Any],
) -> list[tuple[StageRecord, DatasetIterator[Any] | None]]:
    """Every stage's record below `top` (sources first), with the iterator of IterDataset
    stages (None for MapDataset stages and for stages run in workers): what the debug
    summary reads. The records that take a stand-in's place come with it."""
    out: dict[int, tuple[StageRecord, DatasetIterator[Any] | None]] = {}
    for it in walk_iterators(top):
        if isinstance(it, TimedIterator):
            it.settle()
            out[it.record.id] = (it.record, it.inner)
            for r in it.record.stands_for or ():
                out.setdefault(r.id, (r, None))
        for r in map_records(it.computed_dataset()):
            out.setdefault(r.id, (r, None))
    return [out[k] for k in sorted(out)]


def element_spec(x: Any) -> Any:
    """The structure of `x` with each leaf as 'dtype[shape]', as in the pipeline graph."""
    if isinstance(x, dict):
        return {k: element_spec(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(element_spec(v) for v in x))
    if isinstance(x, list | tuple):
        return type(x)(element_spec(v) for v in x)
    if isinstance(x, np.ndarray | np.generic):
        return f"{x.dtype}[{','.join(str(d) for d in np.shape(x))}]"
    return f"{type(x).__name__}[]"


# -- the engine's observer ----------------------------------------------------------------


class DebugObserver(observe.PipelineObserver):
    """The instrumentation as the engine sees it (`observe.PipelineObserver`): timed
    iterators and map chains; in worker processes the GIL sampler, and each chunk's figures
    (`StageRecord.take_delta`) merged into the main process's records."""

    def iterator(
        self, ds: IterDataset[Any], make: Callable[[], DatasetIterator[Any]]
    ) -> DatasetIterator[Any]:
        return instrumented_iter(ds, make)

    def map_chain(self, ds: MapDataset[Any]) -> MapDataset[Any]:
        return timed_map_chain(ds)

    def stream_chain(self, ds: MapDataset[Any]) -> MapDataset[Any]:
        return timed_map_chain(ds, read=False)

    def shard(self, ds: IterDataset[Any]) -> IterDataset[Any]:
        return _TimedShard(ds)

    def worker_start(self, leaves: Sequence[Any]) -> Callable[[], list[Any]] | None:
        records = [r for leaf in leaves for r in map_records(leaf)]
        if not records:
            return None
        for r in records:  # blocks the main process computed before the chain was sent
            r.blocks = []
        ensure_sampler()  # debug mode: sample the GIL in the worker too

        def take() -> list[Any]:
            return [r.take_delta() for r in records if r.calls]

        return take

    def figures_merger(self, leaves: Sequence[Any]) -> Callable[[list[Any]], None] | None:
        by_id = {r.id: r for leaf in leaves for r in map_records(leaf)}
        if not by_id:
            return None

        def merge(deltas: list[Any]) -> None:
            with handout.lock:
                for delta in deltas:
                    by_id[delta[0]].merge(delta)

        return merge


observe.install(DebugObserver())
