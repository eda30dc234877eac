"""Hypothesis strategies drawing cases from the grammar of `pipelines.py`.

Sizes stay small (tens of records) so that a case runs in milliseconds in process; worker
processes cost a start each, so the strategies draw them only where a test asks.
"""

from __future__ import annotations

import functools
from typing import Any

from hypothesis import strategies as st

from conformance.pipelines import (
    BATCHING,
    GROUPING,
    ITER_SOURCES,
    MAP_SOURCES,
    Loader,
    Pipeline,
    Run,
)
from conformance.runner import Case

sizes = st.integers(5, 48)
seeds = st.integers(0, 3)
fixed_weights = st.sampled_from([(1.0, 1.0), (1.0, 3.0), (2.0, 1.0), (5.0, 2.0)])
mix_weights = st.one_of(fixed_weights, st.just("fn"))
# Weights given between steps; 0 switches a source off (issue 47 defect 5 rejects it).
runtime_weights = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0, 8.0]), st.sampled_from([0.0, 1.0, 2.0, 3.0, 9.0, 0.5])
).filter(lambda w: sum(w) > 0)


@st.composite
def sources(
    draw: st.DrawFn, kinds: tuple[str, ...] = MAP_SOURCES + ITER_SOURCES
) -> tuple[Any, ...]:
    kind = draw(st.sampled_from(kinds))
    match kind:
        case "range" | "list" | "user" | "zip_map" | "iter_list" | "countdown" | "zip_iter":
            return (kind, draw(sizes))
        case "mix_map":
            return (kind, draw(sizes), draw(sizes), draw(mix_weights))
        case "concat":
            return (kind, draw(sizes), draw(sizes))
        case "mix_iter":
            how = draw(st.sampled_from(["dict", "list"]))
            pre = draw(st.sampled_from([0, 0, 0, 3]))
            return (kind, how, draw(sizes), draw(sizes), draw(mix_weights), pre)
        case "interleave":
            return (
                kind,
                draw(st.integers(1, 4)),
                draw(st.integers(2, 12)),
                draw(st.integers(1, 3)),
            )
        case "jsonl_map":
            return (kind, draw(st.integers(1, 3)), draw(st.integers(2, 12)))
        case "select_map":
            n1, n2 = draw(sizes), draw(sizes)
            return (kind, n1, n2, draw(seeds), draw(st.integers(1, n1 + n2)))
        case "jsonl":
            return (
                kind,
                draw(st.integers(1, 3)),
                draw(st.integers(2, 12)),
                draw(st.integers(1, 3)),
            )
    raise AssertionError(kind)


@st.composite
def map_ops(draw: st.DrawFn, only: str | None = None) -> tuple[tuple[Any, ...], ...]:
    """Up to three MapDataset operations (with `only`: that one operation, once)."""
    ops: list[tuple[Any, ...]] = []
    grouped = False
    for _ in range(1 if only else draw(st.integers(0, 3))):
        name = only or draw(st.sampled_from(["shuffle", "map", "random_map", "filter", "slice", "repeat",
                                     "batch", "cache", "window_shuffle", "flat_map"]))  # fmt: skip
        match name:
            case "shuffle":
                ops.append((name, draw(seeds)))
            case "map" | "cache":
                ops.append((name,))
            case "random_map":
                ops.append((name, draw(seeds)))
            case "filter":
                ops.append((name, draw(st.integers(2, 5))))
            case "slice":
                a = draw(st.integers(0, 4))
                b = draw(st.one_of(st.none(), st.integers(a + 1, 40)))
                ops.append((name, a, b, draw(st.integers(1, 3))))
            case "repeat":
                ops.append((name, draw(st.integers(1, 2))))
            case "batch":
                if grouped:
                    continue
                grouped = True
                ops.append((name, draw(st.integers(1, 5)), draw(st.booleans())))
            case "window_shuffle":
                ops.append((name, draw(st.integers(2, 10)), draw(seeds)))
            case "flat_map":
                ops.append((name, draw(st.integers(1, 3))))
    return tuple(ops)


def iter_op(draw: st.DrawFn, name: str) -> tuple[Any, ...]:
    """The IterDataset operation `name` with drawn parameters."""
    match name:
        case "map" | "cache" | "stamp":
            return (name,)
        case "random_map":
            return (name, draw(seeds))
        case "filter":
            return (name, draw(st.integers(2, 5)))
        case "prefetch":
            return (name, draw(st.integers(1, 4)))
        case "repeat":
            return (name, draw(st.integers(1, 2)))
        case "limit":
            return (name, draw(st.integers(1, 30)))
        case "mp":
            return (name, draw(st.sampled_from([False, False, False, True])))
        case "even_batches":
            return (name, draw(st.integers(1, 3)))
        case "window_shuffle":
            return (name, draw(st.integers(2, 12)), draw(seeds))
        case "batch":
            return (name, draw(st.integers(1, 5)), draw(st.booleans()))
        case "batch_by_tokens":
            return (name, draw(st.integers(4, 12)), draw(st.integers(2, 20)),
                    draw(st.booleans()), draw(st.one_of(st.none(), seeds)))  # fmt: skip
        case "bucket":
            return (name, draw(st.one_of(st.none(), st.integers(3, 20))), draw(st.booleans()))
        case "pack":
            kind = draw(st.sampled_from(["first", "best", "concat"]))
            return (name, kind, draw(st.integers(1, 3)))
        case "flat_map":
            return (name, draw(st.integers(1, 3)), draw(st.booleans()))
        case "rebatch":
            return (name, draw(st.integers(1, 6)), draw(st.booleans()))
    raise AssertionError(name)


@st.composite
def iter_ops(
    draw: st.DrawFn, grouped: bool = False, batched: bool = False
) -> tuple[tuple[Any, ...], ...]:
    """Up to four IterDataset operations; `grouped`: the elements are groups already,
    `batched`: batches of records along a leading axis (what `rebatch` takes)."""
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(0, 4))):
        names = ["map", "random_map", "filter", "prefetch", "cache", "repeat", "limit", "stamp",
                 "mp", "flat_map"]  # fmt: skip
        names += ["even_batches"] if grouped else ["window_shuffle", *GROUPING]
        names += ["rebatch"] if batched else []
        name = draw(st.sampled_from(names))
        ops.append(iter_op(draw, name))
        grouped = grouped or name in GROUPING
        batched = batched or name in BATCHING
    return tuple(ops)


@st.composite
def pipelines(draw: st.DrawFn, must: str | None = None) -> Pipeline:
    """A pipeline; with `must` ("source:NAME", "map:NAME" or "iter:NAME"), one that has it."""
    where, _, name = (must or "").partition(":")
    if where == "source":
        source = draw(sources((name,)))
    elif where == "map":
        source = draw(sources(MAP_SOURCES))
    else:
        source = draw(sources())
    m_ops = draw(map_ops()) if source[0] in MAP_SOURCES else ()
    if where == "map":
        forced = draw(map_ops(only=name))
        m_ops = tuple(o for o in m_ops if o[0] != "batch") if name == "batch" else m_ops
        k = draw(st.integers(0, len(m_ops)))
        m_ops = (*m_ops[:k], *forced, *m_ops[k:])
    grouped = any(o[0] == "batch" for o in m_ops)
    if where == "iter" and name in GROUPING:
        m_ops = tuple(o for o in m_ops if o[0] != "batch")
        i_ops = (iter_op(draw, name), *draw(iter_ops(grouped=True, batched=name in BATCHING)))
    elif where == "iter" and name in ("even_batches", "rebatch"):
        m_ops = tuple(o for o in m_ops if o[0] != "batch")
        first = iter_op(
            draw, "batch" if name == "even_batches" else draw(st.sampled_from(BATCHING))
        )
        i_ops = (first, iter_op(draw, name), *draw(iter_ops(grouped=True, batched=True)))
    else:
        i_ops = draw(iter_ops(grouped=grouped, batched=grouped))
        if where == "iter":
            k = draw(st.integers(0, len(i_ops)))
            i_ops = (*i_ops[:k], iter_op(draw, name), *i_ops[k:])
    changes: tuple[tuple[int, Any], ...] = ()
    if source[0] == "mix_iter":
        changes = tuple(
            sorted(
                draw(
                    st.lists(st.tuples(st.integers(0, 12), runtime_weights), min_size=1, max_size=2)
                )
            )
        )
    return Pipeline(source, m_ops, i_ops, changes)


@functools.cache
def runs(workers: tuple[int, ...], backend: str = "procs") -> st.SearchStrategy[Run]:
    """Runs with these worker counts (made once: strategies are cached by hypothesis)."""
    if backend == "ray":
        return st.builds(Run, st.sampled_from(workers), st.just(0), st.just("ray"))
    return st.builds(Run, st.sampled_from(workers), st.sampled_from([0, 1, 2]))


@st.composite
def cases(
    draw: st.DrawFn,
    workers: list[int],
    stats: bool = True,
    backend: str = "procs",
    must: str | None = None,
) -> Case:
    """A pipeline, one or two runs to compare with the reference (0 workers, no threads),
    and a state taken at a random step restored into another run."""
    p = draw(pipelines(must))
    run_st = runs(tuple(workers), backend)
    others = tuple(draw(st.lists(run_st, min_size=1, max_size=2)))
    restore = (draw(st.integers(0, 24)), draw(run_st), draw(st.one_of(run_st, st.just(Run()))))
    stats = stats and draw(st.booleans())
    return Case(p, (Run(), *others), restore, stats=stats)


@st.composite
def loader_cases(draw: st.DrawFn, workers: list[int], must: str | None = None) -> Case:
    """A DataLoader: up to three element-wise operations, then `Batch`,
    `PackAndBatchOperation` or neither; with `must` (a name of `LOADER_OPS`), one that has
    that operation."""
    ops: list[tuple[Any, ...]] = []
    names = [draw(st.sampled_from(["map", "random_map", "filter", "flat_map"]))
             for _ in range(draw(st.integers(0, 3)))]  # fmt: skip
    if must is not None and must not in ("batch", "pack_and_batch"):
        names.insert(draw(st.integers(0, len(names))), must)
    for name in names:
        if name == "filter":
            ops.append((name, draw(st.integers(2, 5))))
        elif name == "flat_map":
            ops.append((name, draw(st.integers(1, 3))))
        else:
            ops.append((name,))
    last = must if must in ("batch", "pack_and_batch") else None
    last = last or draw(st.sampled_from(["none", "batch", "pack_and_batch"]))
    if last == "batch":
        ops.append(("batch", draw(st.integers(1, 5)), draw(st.booleans())))
    elif last == "pack_and_batch":
        ops.append(("pack_and_batch", draw(st.integers(1, 3))))
    lo = Loader(draw(sizes), draw(st.booleans()), draw(seeds), draw(st.integers(1, 2)), tuple(ops))
    w = runs(tuple(workers))
    restore = (draw(st.integers(0, 24)), draw(w), draw(w))
    return Case(lo, (Run(), draw(w)), restore, stats=draw(st.booleans()))
