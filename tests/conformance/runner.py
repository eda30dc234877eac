"""Runs a drawn case every way it asks and checks chute's promises (the invariants).

Invariants, by name (the names the exception and known-defect tables use):

- "resume": a state taken at step k, through `json.dumps`/`json.loads`, restored into a
  fresh pipeline run another way (another worker count), continues with exactly the
  elements the interrupted run itself went on with, and (but where `exceptions.py` says
  the output depends on timing) with those of the reference run.
- "workers": the output is the same for every run (worker count, threads, Ray).
- "once": every record appears once per epoch where the operations promise it
  (`pipelines.expected_ids`).
- "len": `len()` of the random-access part agrees with iterating it.
- "stats": the per-stage produced counts of `chute.stats` (debug mode) are the same for
  every worker count (switched by `CHECK_STATS`).
- "bucket_full": `bucket_by_sequence_length` hands out a short batch only as a bucket's
  final remainder.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import chute
from conformance import pipelines as pl
from conformance.pipelines import Env, Loader, Pipeline, Run

INVARIANTS = ("resume", "workers", "once", "len", "stats", "bucket_full")
# The switch of the "stats" invariant (issue 47 defect 2 is being fixed in parallel):
# on unless CHUTE_CONFORMANCE_STATS=0.
CHECK_STATS = os.environ.get("CHUTE_CONFORMANCE_STATS", "1") != "0"
# A stream longer than this is a runaway (every drawn pipeline is finite and small).
MAX_ELEMENTS = 5000


@dataclass(frozen=True)
class Case:
    """A pipeline (or a `DataLoader`), the runs to compare, and the restore event.

    `runs[0]` is the reference. `restore` is (step, run before, run after)."""

    pipeline: Pipeline | Loader
    runs: tuple[Run, ...] = (Run(),)
    restore: tuple[int, Run, Run] | None = None
    stats: bool = False

    def worker_counts(self) -> set[int]:
        counts = {r.workers for r in self.runs}
        if self.restore:
            counts |= {self.restore[1].workers, self.restore[2].workers}
        return counts

    def all_runs(self) -> list[Run]:
        return [*self.runs, *(self.restore[1:] if self.restore else ())]


def canon(x: Any) -> Any:
    """A comparable form of an element: arrays with their dtype and shape, dicts sorted."""
    if isinstance(x, dict):
        return tuple(sorted((k, canon(v)) for k, v in x.items()))
    if isinstance(x, np.ndarray):
        return ("nd", x.dtype.str, x.shape, x.tolist())
    if isinstance(x, list | tuple):
        return tuple(canon(v) for v in x)
    if isinstance(x, np.generic):
        return x.item()
    return x


class InvalidDraw(Exception):
    """The drawn pipeline breaks a documented rule of its own operations (an
    `even_batches(n)` over fewer than n batches raises, as documented): not a finding."""


# The documented errors of a wrongly sized pipeline: (exception type, message start).
INVALID = (
    (ValueError, "even_batches: this shard ended"),
    # sequential_slice over one stream that cannot be divided (IterDataset.mp_prefetch).
    (ValueError, "mp_prefetch: sequential_slice=True gives each of"),
)


class Driver:
    """Builds and iterates one case's pipeline, applying its weight changes."""

    def __init__(self, case: Case, env: Env) -> None:
        self.case, self.env = case, env

    def iterator(self, run: Run) -> Any:
        p = self.case.pipeline
        if isinstance(p, Loader):
            return iter(pl.build_loader(p, run.workers))
        return iter(pl.build(p, run, self.env))

    def take(self, it: Any, start: int, count: int | None = None) -> list[Any]:
        p = self.case.pipeline
        changes = p.weight_changes if isinstance(p, Pipeline) else ()
        out: list[Any] = []
        step = start
        while count is None or len(out) < count:
            for at, w in changes:
                if at == step and isinstance(p, Pipeline):
                    chute.experimental.set_mix_weights(it, weights_arg(p, w))
            try:
                x = next(it)
            except StopIteration:
                break
            out.append(canon(x))
            step += 1
            if len(out) > MAX_ELEMENTS:
                raise AssertionError(f"runaway stream: more than {MAX_ELEMENTS} elements")
        return out

    def full(self, run: Run) -> list[Any]:
        with closing(self.iterator(run)) as it:
            return self.take(it, 0)

    def resumed(self, k: int, before: Run, after: Run) -> tuple[list[Any], list[Any], list[Any]]:
        """The first k elements, the interrupted run's own continuation, and the stream
        restored from its state at k into a fresh pipeline run as `after`."""
        with closing(self.iterator(before)) as it:
            head = self.take(it, 0, k)
            state = json.loads(json.dumps(it.get_state()))
            own = self.take(it, k)
        with closing(self.iterator(after)) as it:
            it.set_state(state)
            return head, own, self.take(it, k)

    def stage_counts(self, run: Run) -> list[tuple[str, int]]:
        chute.config.update("py_debug_mode", True)
        try:
            # Debug mode prints an execution summary when the iterator ends: not wanted here.
            with contextlib.redirect_stderr(io.StringIO()):
                with closing(self.iterator(run)) as it:
                    self.take(it, 0)
                # Read once closed: the work still in flight then (a read-ahead) has finished
                # or stopped, so the counts do not depend on when they are read.
                stats = chute.stats(it)
        finally:
            chute.config.update("py_debug_mode", False)
        return produced_counts(stats)


def produced_counts(stats: Any) -> list[tuple[str, int]]:
    """(stage kind, elements produced) of every stage, sorted; the stages that only move
    elements elsewhere (worker processes, a prefetch thread) are left out, being the
    execution rather than the user's pipeline."""
    out = []
    for s in stats.stages:
        kind = s.name.split("(")[0].split(" ")[0]
        if kind in EXECUTION_STAGES:
            continue
        out.append((kind, s.elements))
    return sorted(out)


EXECUTION_STAGES = frozenset({"MultiprocessPrefetchIterDataset", "ThreadPrefetchIterDataset"})


def weights_arg(p: Pipeline, w: tuple[float, ...]) -> Any:
    if p.source[0] == "mix_iter" and p.source[1] == "dict":
        return {"a": w[0], "b": w[1]}
    return list(w)


class closing:
    """Closes an iterator (its workers and threads stopped) on leaving the block."""

    def __init__(self, it: Any) -> None:
        self.it = it

    def __enter__(self) -> Any:
        return self.it

    def __exit__(self, *exc: object) -> None:
        close = getattr(self.it, "close", None)
        if close is not None:
            close()


def check_case(
    case: Case,
    env: Env,
    skip: Callable[[str], bool] = lambda invariant: False,
    on_check: Callable[[str], None] | None = None,
) -> None:
    """Checks every invariant the case reaches; `skip(invariant)` leaves one out (the known
    defects and documented exceptions decide). Raises AssertionError naming the invariant."""
    from conformance.exceptions import excepted, weights_in_flight

    with warnings.catch_warnings():
        # mp_prefetch over a stream with no random-access part warns and runs in process.
        warnings.simplefilter("ignore")
        try:
            _check(case, env, skip, excepted, weights_in_flight, on_check or (lambda name: None))
        except Exception as e:
            if any(isinstance(e, t) and str(e).startswith(m) for t, m in INVALID):
                raise InvalidDraw(str(e)) from e
            raise


def _check(
    case: Case, env: Env, skip: Any, excepted: Any, weights_in_flight: Any, note: Any
) -> None:
    d = Driver(case, env)
    p = case.pipeline
    ref_run = case.runs[0]
    ref = d.full(ref_run)
    for run in case.runs[1:]:
        if skip("workers") or excepted("workers", p, ref_run, run):
            continue
        note("workers")
        out = d.full(run)
        assert out == ref, _diff("workers", case, ref_run, run, ref, out)
    if case.restore is not None and not skip("resume"):
        k, before, after = case.restore
        if not excepted("resume", p, before, after):
            note("resume")
            k = min(k, len(ref))
            head, own, rest = d.resumed(k, before, after)
            later = isinstance(p, Pipeline) and any(at >= k for at, _ in p.weight_changes)
            if not (later and weights_in_flight(p)):
                assert rest == own, _diff("resume", case, before, after, own, rest)
            if not excepted("resume_vs_reference", p, before, after):
                base = ref if not excepted("workers", p, ref_run, before) else d.full(before)
                assert head + rest == base, _diff("resume", case, before, after, base, head + rest)
    expected = pl.expected_ids(p)
    if expected is not None and not skip("once"):
        note("once")
        got = Counter(i for x in ref for i in pl.ids_of(_uncanon(x)))
        assert got == expected, f"[once] {case!r}: ids {_counter_diff(expected, got)}"
    if isinstance(p, Pipeline):
        if p.source[0] in pl.MAP_SOURCES and not skip("len"):
            note("len")
            mds = pl.build_map(p, env)
            n = len(mds)
            it = mds.to_iter_dataset(allow_nones=True)
            assert n == len(list(it)), f"[len] {case!r}: len() {n}, iterated {len(list(it))}"
        if not skip("bucket_full"):
            _check_buckets(case, ref, note)
    if case.stats and pl_stats_ok() and not skip("stats"):
        note("stats")
        runs = {run.workers: run for run in case.all_runs()}
        counts = {w: d.stage_counts(run) for w, run in runs.items()}
        first = counts[ref_run.workers]
        for w, c in counts.items():
            if excepted("stats", p, ref_run, runs[w]):
                continue
            assert c == first, (
                f"[stats] {case!r}: per-stage counts with {ref_run.workers} workers {first}, "
                f"with {w} workers {c}"
            )


def pl_stats_ok() -> bool:
    return CHECK_STATS


def _check_buckets(case: Case, ref: list[Any], note: Any) -> None:
    p = case.pipeline
    assert isinstance(p, Pipeline)
    names = [o[0] for o in p.iter_ops]
    if "bucket" not in names:
        return
    after = names[names.index("bucket") + 1 :]
    if any(n not in ("map", "random_map", "prefetch", "mp", "stamp") for n in after):
        return
    if p.iter_ops[names.index("bucket")][1] is not None:
        return  # a wait limit (window_size) hands a bucket out short by design
    note("bucket_full")
    sizes = [2, 3, 2]
    short: Counter[int] = Counter()
    for x in ref:
        ids = pl.ids_of(_uncanon(x))
        length = ids[0] % 7
        b = 0 if length < 2 else 1 if length < 5 else 2
        if len(ids) < sizes[b]:
            short[b] += 1
    assert all(c <= 1 for c in short.values()), (
        f"[bucket_full] {case!r}: short batches mid-stream, per bucket {dict(short)}"
    )


def _uncanon(x: Any) -> Any:
    """The canonical form back as a dict of arrays (enough for `ids_of`)."""
    if isinstance(x, tuple) and x and x[0] == "nd":
        return np.asarray(x[3])
    if isinstance(x, tuple) and all(isinstance(kv, tuple) and len(kv) == 2 for kv in x):
        keys = [kv[0] for kv in x]
        if all(isinstance(k, str) for k in keys):
            return {k: _uncanon(v) for k, v in x}
    if isinstance(x, tuple):  # a tuple of elements (a PackAndBatchOperation's batch)
        return tuple(_uncanon(v) for v in x)
    return x


def _counter_diff(expected: Counter[int], got: Counter[int]) -> str:
    missing = expected - got
    extra = got - expected
    return f"missing {dict(list(missing.items())[:10])}, extra {dict(list(extra.items())[:10])}"


def _diff(name: str, case: Case, a: Run, b: Run, xs: list[Any], ys: list[Any]) -> str:
    first = next((i for i, (x, y) in enumerate(zip(xs, ys)) if x != y), min(len(xs), len(ys)))
    return (
        f"[{name}] {case!r}: {a} gave {len(xs)} elements, {b} gave {len(ys)}; first "
        f"difference at {first}: {xs[first : first + 1]} != {ys[first : first + 1]}"
    )
