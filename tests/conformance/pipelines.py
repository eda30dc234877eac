"""The pipeline grammar: a pipeline is plain data (tuples), built into chute datasets.

A `Pipeline` is a source, the `MapDataset` operations on it (for a random-access source),
and the `IterDataset` operations after `to_iter_dataset`. Written as tuples so that a
failing pipeline shrinks to a readable one and stays in the code as an explicit example:

    Pipeline(("range", 20), (("shuffle", 1),), (("batch", 4, False), ("mp", False)))

is `MapDataset.range(20).map(tag).shuffle(1).to_iter_dataset().batch(4).mp_prefetch(...)`.
How it runs (worker processes, threads, Ray) is a `Run`, kept apart from the pipeline so
that one pipeline runs every way. A `Loader` is a `DataLoader` pipeline.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import chute
from chute import experimental as ex
from conformance import fns

Op = tuple[Any, ...]

# Sources: random access (a MapDataset, then `to_iter_dataset`) or a stream.
MAP_SOURCES = ("range", "list", "user", "mix_map", "concat", "zip_map", "jsonl_map",
               "select_map")  # fmt: skip
ITER_SOURCES = ("iter_list", "mix_iter", "interleave", "jsonl", "countdown", "zip_iter")
# Operations on a MapDataset, on an IterDataset, and those that group elements.
MAP_OPS = ("shuffle", "map", "random_map", "filter", "slice", "repeat", "batch", "cache",
           "window_shuffle", "flat_map")  # fmt: skip
ITER_OPS = ("map", "random_map", "filter", "prefetch", "cache", "repeat", "limit",
            "window_shuffle", "stamp", "mp", "flat_map", "batch", "batch_by_tokens", "bucket",
            "pack", "even_batches", "rebatch")  # fmt: skip
GROUPING = ("batch", "batch_by_tokens", "bucket", "pack")
# Groupings whose elements are batches of records along a leading axis (what
# `even_batches` and `RebatchIterDataset` take; a packed row's leading axis is its tokens).
BATCHING = ("batch", "batch_by_tokens", "bucket")
# DataLoader operations (`Loader.ops`).
LOADER_OPS = ("map", "random_map", "filter", "flat_map", "batch", "pack_and_batch")
# Stages that read the stream in windows (defect 1 of issue 47 lives under them).
WINDOWED = ("window_shuffle", "batch_by_tokens", "bucket", "pack")


@dataclass(frozen=True)
class Pipeline:
    source: Op
    map_ops: tuple[Op, ...] = ()
    iter_ops: tuple[Op, ...] = ()
    # Weight changes between steps: (step, weights), applied before the step-th `next`.
    weight_changes: tuple[tuple[int, Any], ...] = ()

    def ops(self) -> list[str]:
        return [self.source[0], *(o[0] for o in self.map_ops), *(o[0] for o in self.iter_ops)]

    def has_mix_iter(self) -> bool:
        return self.source[0] == "mix_iter"

    def sequential_slice(self) -> bool:
        return any(o[0] == "mp" and o[1] for o in self.iter_ops)


@dataclass(frozen=True)
class Run:
    """How a pipeline runs: worker processes (`mp_prefetch`, or Ray actors), and the
    `to_iter_dataset` threads (`ReadOptions(num_threads=)`)."""

    workers: int = 0
    threads: int = 0
    backend: str = "procs"  # or "ray"

    def mode(self) -> str:
        if self.backend == "ray":
            return "ray"
        return f"{self.workers} workers" if self.workers else "in process"


@dataclass(frozen=True)
class Loader:
    """`DataLoader(data_source=records, sampler=IndexSampler(...), operations=...)`."""

    n: int
    shuffle: bool = False
    seed: int = 0
    epochs: int = 1
    ops: tuple[Op, ...] = ()

    def ops_names(self) -> list[str]:
        return ["dataloader", *(o[0] for o in self.ops)]


@dataclass
class Env:
    """What a build needs from outside: a folder for the record files."""

    data_dir: Path
    made: set[tuple[int, int]] = field(default_factory=set)

    def jsonl_files(self, files: int, n: int) -> list[str]:
        paths = [self.data_dir / f"shard-{files}-{n}-{k}.jsonl" for k in range(files)]
        if (files, n) not in self.made:
            for k, path in enumerate(paths):
                rows = fns.records(5000 + 100 * k, n)
                path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            self.made.add((files, n))
        return [str(p) for p in paths]


# -- building ---------------------------------------------------------------------------------


def _read_options(run: Run) -> chute.ReadOptions:
    return chute.ReadOptions(num_threads=run.threads, prefetch_buffer_size=8)


def _mp_options(run: Run) -> chute.MultiprocessingOptions:
    if run.backend == "ray":
        from chute.ray import RayWorkers

        return RayWorkers(num_workers=max(run.workers, 1), resources_per_worker={"CPU": 0.1})
    return chute.MultiprocessingOptions(num_workers=run.workers, timeout_s=120)


def _map_range(base: int, n: int) -> chute.MapDataset[Any]:
    return chute.MapDataset.range(n).map(fns.TAGS[base])


def build_map(p: Pipeline, env: Env) -> chute.MapDataset[Any]:
    """The random-access part of `p` (its source must be one of MAP_SOURCES)."""
    kind = p.source[0]
    ds: chute.MapDataset[Any]
    if kind == "range":
        ds = _map_range(0, p.source[1])
    elif kind == "list":
        ds = chute.MapDataset.source(fns.records(0, p.source[1]))
    elif kind == "user":
        ds = fns.Records(0, p.source[1])
    elif kind == "mix_map":
        _, n1, n2, w = p.source
        weights = fns.mix_weights_by_step if w == "fn" else list(w)
        ds = chute.MapDataset.mix([_map_range(0, n1), _map_range(1000, n2)], weights)
    elif kind == "concat":
        ds = chute.MapDataset.concatenate(
            [_map_range(0, p.source[1]), _map_range(1000, p.source[2])]
        )
    elif kind == "zip_map":
        n = p.source[1]
        ds = ex.ZipMapDataset([_map_range(0, n), _map_range(1000, n + 3)]).map(fns.merge_pair)
    elif kind == "jsonl_map":
        _, files, n = p.source
        ds = chute.MapDataset.source(chute.sources.JsonlDataSource(env.jsonl_files(files, n)))
    elif kind == "select_map":
        _, n1, n2, seed, length = p.source
        ds = chute.MapDataset.select_from_datasets(
            [_map_range(0, n1), _map_range(1000, n2)], fns.Selection(n1, n2, seed, length)
        )
    else:
        raise ValueError(f"not a MapDataset source: {p.source!r}")
    for op in p.map_ops:
        ds = _map_op(ds, op)
    return ds


def _map_op(ds: chute.MapDataset[Any], op: Op) -> chute.MapDataset[Any]:
    match op:
        case ("shuffle", seed):
            return ds.shuffle(seed=seed)
        case ("map",):
            return ds.map(fns.add_one)
        case ("random_map", seed):
            return ds.random_map(fns.jitter, seed=seed)
        case ("filter", k):
            return ds.filter(fns.KeepIdNotMultiple(k))
        case ("slice", a, b, c):
            return ds[a:b:c]
        case ("repeat", k):
            return ds.repeat(k)
        case ("batch", b, drop):
            return ds.batch(b, drop_remainder=drop)
        case ("cache",):
            return ds.cache()
        case ("window_shuffle", w, seed):
            return ex.WindowShuffleMapDataset(ds, window_size=w, seed=seed)
        case ("flat_map", k):
            return ex.FlatMapMapDataset(ds, fns.SplitInto(k))
    raise ValueError(f"not a MapDataset operation: {op!r}")


def _iter_source(p: Pipeline, run: Run, env: Env) -> chute.IterDataset[Any]:
    ro = _read_options(run)
    match p.source:
        case ("iter_list", n):
            return chute.IterDataset.source(fns.records(0, n))
        case ("mix_iter", how, n1, n2, w, pre):
            a = _map_range(0, n1).to_iter_dataset(ro)
            b = _map_range(1000, n2).to_iter_dataset(ro)
            if pre:
                a, b = a.prefetch(pre), b.prefetch(pre)
            weights: Any = fns.mix_weights_by_step if w == "fn" else list(w)
            if how == "dict":
                weights = fns.mix_weights_by_step_named if w == "fn" else {"a": w[0], "b": w[1]}
                return chute.IterDataset.mix({"a": a, "b": b}, weights)
            return chute.IterDataset.mix([a, b], weights)
        case ("interleave", shards, n, cycle):
            parts = [chute.IterDataset.source(fns.shard_reader(k, n + k)) for k in range(shards)]
            return ex.InterleaveIterDataset(parts, cycle_length=cycle)
        case ("jsonl", files, n, cycle):
            return ex.JsonlIterDataset(
                env.jsonl_files(files, n), fns.parse_jsonl, cycle_length=cycle
            )
        case ("countdown", n):
            return fns.Countdown(0, n)
        case ("zip_iter", n):
            a = _map_range(0, n).to_iter_dataset(ro)
            b = _map_range(1000, n).to_iter_dataset(ro)
            return ex.ZipIterDataset([a, b]).map(fns.merge_pair)
    raise ValueError(f"not an IterDataset source: {p.source!r}")


def build(p: Pipeline, run: Run, env: Env) -> chute.IterDataset[Any]:
    """`p` as an IterDataset run as `run` says; an `mp_prefetch` closes it if it has none."""
    if p.source[0] in MAP_SOURCES:
        ds = build_map(p, env).to_iter_dataset(_read_options(run))
    else:
        ds = _iter_source(p, run, env)
    for op in p.iter_ops:
        ds = _iter_op(ds, op, run)
    if not any(op[0] == "mp" for op in p.iter_ops):
        ds = ds.mp_prefetch(_mp_options(run))
    return ds


def _iter_op(ds: chute.IterDataset[Any], op: Op, run: Run) -> chute.IterDataset[Any]:
    match op:
        case ("map",):
            return ds.map(fns.add_one)
        case ("random_map", seed):
            return ds.random_map(fns.jitter, seed=seed)
        case ("filter", k):
            return ds.filter(fns.KeepIdNotMultiple(k))
        case ("prefetch", k):
            return ds.prefetch(k)
        case ("cache",):
            return ds.cache()
        case ("repeat", k):
            return ds.repeat(k)
        case ("limit", k):
            return ds.limit(k)
        case ("window_shuffle", w, seed):
            return ex.WindowShuffleIterDataset(ds, window_size=w, seed=seed)
        case ("stamp",):
            return fns.Stamp(ds)
        case ("mp", seq):
            return ds.mp_prefetch(_mp_options(run), sequential_slice=seq)
        case ("batch", b, drop):
            return ds.batch(b, drop_remainder=drop)
        case ("batch_by_tokens", max_tokens, window, sort, seed):
            return ds.batch_by_tokens(
                max_tokens, length_fn=fns.seq_length, window_size=window, sort=sort, seed=seed
            )
        case ("bucket", window, drop):
            return ds.bucket_by_sequence_length(
                fns.bucket_length, [2, 5], [2, 3, 2], window_size=window, drop_remainder=drop
            )
        case ("pack", "first", bins):
            return ex.FirstFitPackIterDataset(
                ds.map(fns.as_sequence),
                length_struct={"id": 6, "v": 6},
                num_packing_bins=bins,
                shuffle_bins=False,
            )
        case ("pack", "best", bins):
            return ex.BestFitPackIterDataset(
                ds.map(fns.as_sequence),
                length_struct={"id": 6, "v": 6},
                num_packing_bins=bins,
                shuffle_bins=True,
                seed=3,
            )
        case ("pack", "concat", _):
            return ex.ConcatThenSplitIterDataset(
                ds.map(fns.as_sequence), length_struct={"id": 5, "v": 5}
            )
        case ("even_batches", n):
            return ds.even_batches(n)
        case ("flat_map", k, bounded):
            return ex.FlatMapIterDataset(ds, fns.SplitInto(k, bounded))
        case ("rebatch", b, drop):
            return ex.RebatchIterDataset(ds, b, drop_remainder=drop)
    raise ValueError(f"not an IterDataset operation: {op!r}")


def build_loader(lo: Loader, workers: int) -> chute.DataLoader:
    ops: list[Any] = []
    for op in lo.ops:
        match op:
            case ("map",):
                ops.append(fns.AddOne())
            case ("random_map",):
                ops.append(fns.Jitter())
            case ("filter", k):
                ops.append(fns.KeepNotMultiple(k))
            case ("flat_map", k):
                ops.append(fns.SplitInto(k))
            case ("batch", b, drop):
                ops.append(chute.Batch(b, drop_remainder=drop))
            case ("pack_and_batch", b):
                ops.append(fns.AsSequence())
                ops.append(ex.PackAndBatchOperation(length_struct={"id": 6, "v": 6}, batch_size=b))
            case _:
                raise ValueError(f"not a DataLoader operation: {op!r}")
    sampler = chute.IndexSampler(lo.n, shuffle=lo.shuffle, num_epochs=lo.epochs, seed=lo.seed)
    return chute.DataLoader(
        data_source=fns.records(0, lo.n), sampler=sampler, operations=ops, worker_count=workers
    )


# -- what the operations promise about identities ---------------------------------------------


def expected_ids(p: Pipeline | Loader) -> Counter[int] | None:
    """The multiset of record ids one pass of `p` hands out, where its operations promise
    it (every record once per epoch); None where they do not (a mixture ends when a
    component runs out, `limit`, `even_batches`, a drop of a remainder, a filter of whole
    batches, a slice after a shuffle...)."""
    if isinstance(p, Loader):
        return _loader_ids(p)
    ordered: list[int | None] | None
    src = p.source
    match src:
        case (
            ("range", n)
            | ("list", n)
            | ("user", n)
            | ("iter_list", n)
            | ("zip_map", n)
            | (
                "zip_iter",
                n,
            )
        ):
            ordered = [i for i in range(n)]
        case ("concat", n1, n2):
            ordered = [*range(n1), *(1000 + i for i in range(n2))]
        case ("countdown", n):
            ordered = [*range(n - 1, -1, -1)]
        case ("interleave", shards, n, _):
            ids = Counter(3000 + 100 * k + i for k in range(shards) for i in range(n + k))
            return _through(ids, None, p, grouped=False)
        case ("jsonl", files, n, _):
            ids = Counter(5000 + 100 * k + i for k in range(files) for i in range(n))
            return _through(ids, None, p, grouped=False)
        case ("jsonl_map", files, n):
            ordered = [5000 + 100 * k + i for k in range(files) for i in range(n)]
        case ("select_map", n1, n2, seed, length):
            ordered = [1000 * d + i for d, i in fns.selection(n1, n2, seed, length)]
        case _:
            return None
    return _through(Counter(i for i in ordered if i is not None), ordered, p, grouped=False)


def _through(
    ids: Counter[int], ordered: list[int | None] | None, p: Pipeline, grouped: bool
) -> Counter[int] | None:
    """Carries the ids through `p`'s operations. A MapDataset `filter` keeps its positions
    (a rejected element reads as None, skipped only when iterating), so slicing after it
    slices positions: `ordered` keeps None there until `to_iter_dataset`."""
    for index, op in enumerate((*p.map_ops, ("to_iter",), *p.iter_ops)):
        name = op[0]
        on_map = index < len(p.map_ops)
        if name in ("map", "random_map", "prefetch", "cache", "stamp"):
            continue
        if name == "to_iter":
            if ordered is not None:
                ordered = [i for i in ordered if i is not None]
            continue
        if name == "mp":
            if op[1]:
                ordered = None
            continue
        if name in ("shuffle", "window_shuffle"):
            ordered = None
        elif name == "filter":
            if grouped:
                return None
            ids = Counter({i: c for i, c in ids.items() if i % op[1] != 0})
            if ordered is not None:
                kept = [None if i is None or i % op[1] == 0 else i for i in ordered]
                ordered = kept if on_map else [i for i in kept if i is not None]
        elif name == "slice":
            if ordered is None or grouped:
                return None
            ordered = ordered[op[1] : op[2] : op[3]]
            ids = Counter(i for i in ordered if i is not None)
        elif name == "repeat":
            ids = Counter({i: c * op[1] for i, c in ids.items()})
            ordered = None if ordered is None else ordered * op[1]
        elif name == "flat_map":
            if grouped:
                return None  # a group's parts: copies of all its records, by its first id
            k = op[1]
            ids = Counter({i: c * fns.parts_of(i, k) for i, c in ids.items()})
            ids = Counter({i: c for i, c in ids.items() if c})
            if ordered is not None:
                # On a MapDataset, element i owns k positions (None past its parts).
                pad = k if on_map else 0
                ordered = [
                    x
                    for i in ordered
                    for x in (
                        [None] * pad
                        if i is None
                        else [i] * fns.parts_of(i, k) + [None] * (pad - fns.parts_of(i, k))
                    )
                ]
        elif name == "rebatch" and not op[-1]:
            continue  # the rows of batches, in new batches
        elif name in ("batch", "bucket") and not op[-1]:
            if on_map and ordered is not None and None in ordered:
                return None  # batches of a filtered MapDataset: not a promise made here
            grouped = True
        elif name == "batch_by_tokens" or (name == "pack" and op[1] != "concat"):
            grouped = True
        else:  # limit, even_batches, a dropped remainder, concat-then-split
            return None
    return ids


def _loader_ids(lo: Loader) -> Counter[int] | None:
    """A DataLoader reads every record once per epoch; its operations as in `_through`
    (`PackAndBatchOperation` keeps every sequence: none is longer than its rows)."""
    ids = Counter({i: lo.epochs for i in range(lo.n)})
    grouped = False
    for op in lo.ops:
        match op:
            case ("map",) | ("random_map",) | ("pack_and_batch", _):
                pass
            case ("filter", k):
                if grouped:
                    return None
                ids = Counter({i: c for i, c in ids.items() if i % k != 0})
            case ("flat_map", k):
                if grouped:
                    return None
                ids = Counter({i: c * fns.parts_of(i, k) for i, c in ids.items()})
                ids = Counter({i: c for i, c in ids.items() if c})
            case ("batch", _, drop):
                if drop:
                    return None
                grouped = True
            case _:
                return None
    return ids


def ids_of(element: Any) -> list[int]:
    """The record ids in one output element (a record, a batch, a packed row, or the
    `(data, segmentations, positions)` batch of a `PackAndBatchOperation`)."""
    if isinstance(element, tuple) and len(element) == 3 and isinstance(element[1], dict):
        ids, seg = np.asarray(element[0]["id"]), np.asarray(element[1]["id"])
        return _segments(ids, seg)
    if isinstance(element, dict) and "id_segment_ids" in element:
        ids = np.asarray(element["id"])
        seg = np.asarray(element["id_segment_ids"])
        return _segments(ids, seg)
    return [int(i) for i in np.asarray(element["id"]).ravel()]


def _segments(ids: np.ndarray, seg: np.ndarray) -> list[int]:
    """The first id of every segment of packed rows (segment ids 1.., 0 in padding)."""
    ids, seg = ids.reshape(-1, ids.shape[-1]), seg.reshape(-1, seg.shape[-1])
    out = []
    for row_ids, row_seg in zip(ids, seg, strict=True):
        for s in sorted(set(row_seg.tolist()) - {0}):
            out.append(int(row_ids[row_seg == s][0]))
    return out
