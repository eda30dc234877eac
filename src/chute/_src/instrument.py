"""Debug-mode instrumentation: a timing proxy around every stage, built with the iterator.

Only when `chute.config` asks for it (`py_debug_mode`, or a visualization directory) does
`IterDataset.__iter__` build instrumented iterators; otherwise nothing here runs, and a
pipeline pays nothing for it. Instrumented:

- every IterDataset stage's iterator is wrapped in a `TimedIterator` (state, prefetch and
  close pass straight through, so checkpoints are unchanged);
- the MapDataset under a `to_iter_dataset` is rebuilt (`rewrite_graph`) with a
  `_TimedMapDataset` around every node, timing each block call; in worker processes the
  same copy runs, and the figures travel back with every chunk and are merged;
- a sampler thread wakes every few milliseconds and notes, for the stage each thread is in,
  whether it had to wait for the GIL: a wait means some thread was running Python code
  (GIL held); no wait means the work was in code that released the GIL.

It finds its way through the node protocol only: `parents`, `role`, `concurrent`,
`with_parents` on datasets; `children()` and `computed_dataset()` on iterators. Each
record carries the stage's `role` and `internal` (a pass-through stage: a seed, a stand-in
for a stage moved into workers, `mp_prefetch` with no workers), which the summary hides.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from chute._src import config
from chute._src.dataset import IterDataset, MapDataset, rewrite_graph, stages_sources_first
from chute._src.iterator import DatasetIterator, walk
from chute._src.protocol import StageRole

_ids = itertools.count()
_get_ident = threading.get_ident
_perf_counter_ns = time.perf_counter_ns
_sched = threading.local()


def _thread_time_ns() -> int:
    """Nanoseconds this thread has been on a CPU or waiting in the run queue for one.

    Counting run-queue time too makes "busy" mean "wanted a CPU", so a CPU-bound stage
    still reads as busy on a machine whose cores are all taken. Linux reports both per
    thread in /proc/thread-self/schedstat; elsewhere, the thread's CPU time is used.
    """
    fd = getattr(_sched, "fd", None)
    if fd is None:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            fd = -1
        _sched.fd = fd
    if fd < 0:
        return time.thread_time_ns()
    on_cpu, waiting, _ = os.pread(fd, 96, 0).split(maxsplit=2)
    return int(on_cpu) + int(waiting)


class StageRecord:
    """Figures of one stage, accumulated where it runs (picklable, merged from workers)."""

    __slots__ = (
        "boundary",
        "calls",
        "cpu_ns",
        "cpu_wall_ns",
        "elements",
        "gil_busy",
        "id",
        "inputs",
        "internal",
        "kind",
        "max_ns",
        "min_ns",
        "name",
        "role",
        "samples",
        "spec",
        "wall_ns",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        inputs: list[int],
        boundary: bool = False,
        role: StageRole = StageRole.ORDER_DEPENDENT,
    ) -> None:
        self.id = next(_ids)
        self.name = name
        self.kind = kind  # "map" (MapDataset node, timed per block) or "iter"
        self.inputs = inputs
        self.boundary = boundary  # its inputs run on other threads or processes
        self.role = role.value  # what the stage is to the engine (`StageRole`)
        # A pass-through stage (seed, stand-in, mp_prefetch without workers): does no work
        # of its own, so a summary hides it and never names it as the bottleneck.
        self.internal = role is StageRole.PASS_THROUGH
        self.spec: Any = None
        self.calls = self.elements = self.wall_ns = self.cpu_ns = self.cpu_wall_ns = 0
        self.min_ns = 1 << 62
        self.max_ns = 0
        self.samples = self.gil_busy = 0

    def add(self, n: int, wall_ns: int, cpu_ns: int | None) -> None:
        """One call that produced `n` elements; `cpu_ns` None when CPU time was not read."""
        self.calls += 1
        self.elements += n
        self.wall_ns += wall_ns
        if cpu_ns is not None:
            self.cpu_ns += cpu_ns
            self.cpu_wall_ns += wall_ns
        if n:
            per = wall_ns // n
            self.min_ns = min(self.min_ns, per)
            self.max_ns = max(self.max_ns, per)

    def take_delta(self) -> tuple[Any, ...]:
        """The figures since the last call, and a reset (used in worker processes)."""
        delta = (
            self.id, self.calls, self.elements, self.wall_ns, self.cpu_ns, self.cpu_wall_ns,
            self.min_ns, self.max_ns, self.samples, self.gil_busy, self.spec,
        )  # fmt: skip
        self.calls = self.elements = self.wall_ns = self.cpu_ns = self.cpu_wall_ns = 0
        self.samples = self.gil_busy = 0
        self.min_ns, self.max_ns = 1 << 62, 0
        return delta

    def cpu_estimate_ns(self) -> float:
        """CPU time over all calls, from the calls whose CPU time was read."""
        return self.cpu_ns / self.cpu_wall_ns * self.wall_ns if self.cpu_wall_ns else 0.0

    def merge(self, delta: tuple[Any, ...]) -> None:
        _, calls, elements, wall, cpu, cpu_wall, lo, hi, samples, busy, spec = delta
        self.calls += calls
        self.elements += elements
        self.wall_ns += wall
        self.cpu_ns += cpu
        self.cpu_wall_ns += cpu_wall
        self.min_ns = min(self.min_ns, lo)
        self.max_ns = max(self.max_ns, hi)
        self.samples += samples
        self.gil_busy += busy
        if self.spec is None:
            self.spec = spec


# -- which stage each thread is in, for the GIL sampler ------------------------------------

_stacks: dict[int, list[tuple[StageRecord, int]]] = {}  # thread -> (stage, entered at ns)
_sampler_lock = threading.Lock()
_sampler: threading.Thread | None = None
_SAMPLE_S = 0.004
_BUSY_S = 0.002  # woken this late: the GIL was held by a thread running Python code


def _stack() -> list[tuple[StageRecord, int]]:
    tid = threading.get_ident()
    stack = _stacks.get(tid)
    if stack is None:
        stack = _stacks[tid] = []
    return stack


def _sample_forever() -> None:
    """Each sample notes, for the stage every thread is in, whether this thread could get
    the GIL at once on waking (the stage's work released it) or had to wait (some thread
    was running Python code). Samples fall where the GIL changes hands, so they are a rough
    measure; the advice leans first on each stage's exact CPU and wall time."""
    sleep_ns, busy_ns = int(_SAMPLE_S * 1e9), int(_BUSY_S * 1e9)
    while True:
        wake = time.perf_counter_ns() + sleep_ns
        time.sleep(_SAMPLE_S)
        busy = time.perf_counter_ns() - wake > busy_ns
        for stack in list(_stacks.values()):
            if stack:
                record = stack[-1][0]
                record.samples += 1
                record.gil_busy += busy


def _ensure_sampler() -> None:
    global _sampler
    with _sampler_lock:
        if _sampler is None:
            _sampler = threading.Thread(
                target=_sample_forever, name="chute-gil-sampler", daemon=True
            )
            _sampler.start()


def _timed(record: StageRecord, fn: Any, *args: Any) -> tuple[Any, int, int | None]:
    """`fn(*args)`, its wall time and, on every 16th call, its thread CPU time.

    Reading a thread's CPU time is a system call (~0.5 us), too dear for every element, so
    it is read on a sixteenth of the calls and scaled (`StageRecord.cpu_estimate_ns`).
    """
    stack = _stack()
    read_cpu = not record.calls & 15
    c0 = time.thread_time_ns() if read_cpu else 0
    t0 = time.perf_counter_ns()
    stack.append((record, t0))
    try:
        out = fn(*args)
    finally:
        wall = time.perf_counter_ns() - t0
        stack.pop()
    return out, wall, (time.thread_time_ns() - c0) if read_cpu else None


# -- MapDataset side ----------------------------------------------------------------------


class _TimedMapDataset(MapDataset[Any]):
    """Times `_getitems` of the node it wraps (inclusive of the node's timed parents)."""

    role = StageRole.PASS_THROUGH

    def __init__(self, inner: MapDataset[Any], record: StageRecord) -> None:
        super().__init__([inner])
        self.record = record

    @property
    def inner(self) -> MapDataset[Any]:
        return self._parents[0]

    @property
    def fingerprint(self) -> str:
        return self.inner.fingerprint

    def __len__(self) -> int:
        return len(self.inner)

    def _getitems(self, indices: np.ndarray) -> list[Any]:
        out, wall, cpu = _timed(self.record, self._parents[0]._getitems, indices)
        self.record.add(len(indices), wall, cpu)
        if self.record.spec is None:
            first = next((x for x in out if x is not None), None)
            if first is not None:
                self.record.spec = element_spec(first)
        return out

    def __repr__(self) -> str:
        return repr(self.inner)


def timed_map_chain(ds: MapDataset[Any]) -> MapDataset[Any]:
    """A copy of `ds` with every node timed; same elements, same fingerprint."""

    def timed(node: MapDataset[Any]) -> MapDataset[Any]:
        inputs = [cast(_TimedMapDataset, p).record.id for p in node.parents]
        return _TimedMapDataset(node, StageRecord(repr(node), "map", inputs, role=node.role))

    return rewrite_graph(ds, timed)


def map_records(ds: MapDataset[Any] | None) -> list[StageRecord]:
    """The records of a timed map chain, sources first."""
    if ds is None:
        return []
    return [n.record for n in stages_sources_first(ds) if isinstance(n, _TimedMapDataset)]


# -- IterDataset side ---------------------------------------------------------------------


class TimedIterator(DatasetIterator[Any]):
    """Times its stage's iterator. Not a stage itself: the state is the inner one's."""

    def __init__(self, inner: DatasetIterator[Any], record: StageRecord) -> None:
        super().__init__(inner)
        self._inner = inner
        self.record = record
        self.top: Any = None  # set on the outermost proxy: what prints summaries

    @property
    def inner(self) -> DatasetIterator[Any]:
        return self._inner

    def __next__(self) -> Any:
        # `_timed` inlined: this runs once per element per stage in debug mode.
        record = self.record
        stack = _stacks.get(_get_ident()) or _stack()
        read_cpu = not record.calls & 15
        c0 = _thread_time_ns() if read_cpu else 0
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
            record.cpu_ns += _thread_time_ns() - c0
            record.cpu_wall_ns += wall
        if record.spec is None:
            record.spec = element_spec(x)
        if self.top is not None and (record.calls == 1 or not record.calls & 63):
            self.top.tick()
        return x

    def _next_many(self, n: int) -> list[Any]:
        xs, wall, cpu = _timed(self.record, self._inner._next_many, n)
        self.record.add(len(xs), wall, cpu)
        if self.record.spec is None and xs:
            self.record.spec = element_spec(xs[0])
        return xs

    def get_state(self) -> dict[str, Any]:
        return self._inner.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self._inner.set_state(state)

    def _restore(self, state: Any, path: str) -> None:
        self._inner._restore(state, path)

    def start_prefetch(self) -> None:
        self._inner.start_prefetch()

    def close(self) -> None:
        if self.top is not None:
            self.top.finished()
        self._inner.close()


_depth = threading.local()


def instrumented_iter(ds: IterDataset[Any]) -> DatasetIterator[Any]:
    """`iter(ds)` with every stage timed; the outermost call attaches the pipeline view."""
    level = getattr(_depth, "level", 0)
    _depth.level = level + 1
    try:
        inner = ds.make_iterator()
    finally:
        _depth.level = level
    record = StageRecord(repr(ds), "iter", _input_ids(inner), boundary=ds.concurrent, role=ds.role)
    proxy = TimedIterator(inner, record)
    if level == 0:
        if config.get("py_debug_mode"):
            _ensure_sampler()
        if _view_factory is not None:
            proxy.top = _view_factory(proxy)
    return proxy


_view_factory: Callable[[TimedIterator], Any] | None = None


def attach_view(factory: Callable[[TimedIterator], Any]) -> None:
    """Where the debug summary plugs in: `factory(top)` is built for the outermost timed
    iterator and kept as `top.top` (it gets `tick()` and `finished()` calls)."""
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
    stages (None for MapDataset stages): what the debug summary reads."""
    out: dict[int, tuple[StageRecord, DatasetIterator[Any] | None]] = {}
    for it in walk(top):
        if isinstance(it, TimedIterator):
            out[it.record.id] = (it.record, it.inner)
        for r in map_records(it.computed_dataset()):
            out.setdefault(r.id, (r, None))
    return [out[k] for k in sorted(out)]


def element_spec(x: Any) -> Any:
    """The structure of `x` with each leaf as 'dtype[shape]', as in seed 003's graph."""
    if isinstance(x, dict):
        return {k: element_spec(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(element_spec(v) for v in x))
    if isinstance(x, list | tuple):
        return type(x)(element_spec(v) for v in x)
    if isinstance(x, np.ndarray | np.generic):
        return f"{x.dtype}[{','.join(str(d) for d in np.shape(x))}]"
    return f"{type(x).__name__}[]"
