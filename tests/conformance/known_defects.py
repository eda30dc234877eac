"""KNOWN_DEFECTS: the ONE table of defects the suite knows of and that are not fixed yet.

Each entry says which invariants it breaks (`"*"`: the case cannot run at all), which
drawn cases it reaches (`applies`), and its explicit examples. The generative tests leave
exactly those invariants out for exactly those cases (`skip_for`), so they stay green on
the current code; `test_known_defects.py` runs every example with an
`xfail(strict=False)` naming the defect. When a fix lands, delete its entry (or set
`fixed=True`): its examples then run as plain regression tests, and the generative tests
draw the composition again.

Numbers 1-10 are issue 47's list; "new-N" are defects this suite found beyond them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conformance.pipelines import MAP_SOURCES, WINDOWED, Loader, Pipeline, Run
from conformance.runner import Case

ALL = "*"


@dataclass(frozen=True)
class KnownDefect:
    key: str  # "1".."10" (issue 47's list) or "new-N"
    title: str
    invariants: frozenset[str]
    applies: Callable[[Case], bool]
    examples: tuple[Case | Callable[[Any], None], ...]
    fixed: bool = False

    def reason(self) -> str:
        where = "issue 47 defect" if self.key[0].isdigit() else "conformance suite finding"
        return f"{where} {self.key}: {self.title}"


def _p(case: Case) -> Pipeline | None:
    return case.pipeline if isinstance(case.pipeline, Pipeline) else None


def _names(case: Case) -> list[str]:
    p = _p(case)
    return [o[0] for o in p.iter_ops] if p else []


def _uses_workers(case: Case) -> bool:
    return any(w > 0 for w in case.worker_counts()) or any(
        r.backend == "ray" for r in case.all_runs()
    )


def _weights_then_restore(case: Case) -> bool:
    p = _p(case)
    return bool(p and p.has_mix_iter() and p.weight_changes and case.restore is not None)


def _d1(case: Case) -> bool:
    return _weights_then_restore(case) and any(
        n in WINDOWED or n == "prefetch" for n in _names(case)
    )


ELEMENT_WISE = ("map", "random_map", "filter")


def _d2(case: Case) -> bool:
    """An iter-side map/filter that mp_prefetch moves into the workers: reported under
    another kind (MapMapDataset for MapIterDataset) and, for a filter, with its input
    count. (A `prefetch` between does not stop the move: conservative.)"""
    p = _p(case)
    if p is None or not (case.stats and _uses_workers(case)) or p.source[0] not in MAP_SOURCES:
        return False
    for n in _names(case):
        if n in ELEMENT_WISE or n == "pack":  # a packer starts with a map of its own
            return True
        if n != "prefetch":
            return False
    return False


def _d3(case: Case) -> bool:
    return "bucket" in _names(case)


def _d5(case: Case) -> bool:
    p = _p(case)
    return bool(p and any(0.0 in w for _, w in p.weight_changes))


def _d6(case: Case) -> bool:
    p = _p(case)
    if p is None or not _uses_workers(case):
        return False
    two_readers = p.source[0] == "mix_iter" and p.source[5] > 0
    names = _names(case)
    seq_over_prefetch = p.sequential_slice() and "prefetch" in names[: _last_mp(names)]
    return two_readers or seq_over_prefetch


def _last_mp(names: list[str]) -> int:
    return max((i for i, n in enumerate(names) if n == "mp"), default=len(names))


def _d7(case: Case) -> bool:
    return _names(case).count("mp") >= 2 and _uses_workers(case)


def _d8(case: Case) -> bool:
    names = _names(case)
    return (
        _weights_then_restore(case)
        and "cache" in names
        and "repeat" in names[names.index("cache") :]
    )


def _d9(case: Case) -> bool:
    p = _p(case)
    return bool(p and case.stats and _uses_workers(case) and p.source[0] in ("jsonl", "interleave"))


def _d10(case: Case) -> bool:
    return case.stats and isinstance(case.pipeline, Loader)


def _new1(case: Case) -> bool:
    """A stream that stops before its source ends (`limit`, `even_batches`, a mixture
    ending when one component runs out), with worker processes somewhere."""
    p = _p(case)
    if p is None or not (case.stats and _uses_workers(case)):
        return False
    return p.source[0] == "mix_iter" or any(n in ("limit", "even_batches") for n in _names(case))


def _new2(case: Case) -> bool:
    """A mixture whose weights change at or after the restored step, under a stage that
    reads ahead in windows (buckets, batch_by_tokens, packers, window shuffle)."""
    p = _p(case)
    if p is None or not _weights_then_restore(case) or case.restore is None:
        return False
    later = any(at >= case.restore[0] for at, _ in p.weight_changes)
    return later and any(n in WINDOWED for n in _names(case))


def _new4(case: Case) -> bool:
    """A mixture whose weights change, restored, under a stage that reads in chunks."""
    return _weights_then_restore(case) and any(n in WINDOWED for n in _names(case))


def _new5(case: Case) -> bool:
    """A user stage (`stamp`) over a mixture whose weights change, restored."""
    return _weights_then_restore(case) and "stamp" in _names(case)


def _new6(case: Case) -> bool:
    """An IterDataset.cache() above a chunk-reading stage over a mixture whose weights
    change, restored."""
    names = _names(case)
    if not (_weights_then_restore(case) and "cache" in names):
        return False
    return any(n in WINDOWED for n in names[: names.index("cache")])


def _new3(case: Case) -> bool:
    """A MapDataset.cache() in a pipeline whose counts are compared across worker counts."""
    p = _p(case)
    return bool(
        p and case.stats and _uses_workers(case) and any(o[0] == "cache" for o in p.map_ops)
    )


def _new7(case: Case) -> bool:
    """An IterDataset.cache() replayed (a repeat above it) whose counts are compared."""
    names = _names(case)
    return case.stats and "cache" in names and "repeat" in names[names.index("cache") :]


def _new8(case: Case) -> bool:
    """A stream that stops early (as new-1) where what was read ahead is not the reader's
    own positions: the parts of a MapDataset mixture, concatenation, selection, cache or
    window shuffle under the reader, or stages above it that read ahead themselves (shards, prefetch threads)."""
    p = _p(case)
    if p is None or not _new1(case):
        return False
    split = p.source[0] in ("mix_map", "concat", "select_map") or any(
        o[0] in ("cache", "window_shuffle") for o in p.map_ops
    )
    ahead = p.source[0] in ("mix_iter", "interleave", "jsonl") or "prefetch" in _names(case)
    return split or ahead


def _new9(case: Case) -> bool:
    """A MapDataset flat map (a DataLoader's flat map is one) whose counts are compared."""
    if not case.stats:
        return False
    if isinstance(case.pipeline, Loader):
        return any(o[0] == "flat_map" for o in case.pipeline.ops)
    p = _p(case)
    return bool(p and any(o[0] == "flat_map" for o in p.map_ops))


def _d4_weight_change_reaches_mix_late(env: Any) -> None:
    """A weight change must reach the mixture within the window of the stage above it:
    here `batch_by_tokens(window_size=100)`. Elements past one window after the change
    must follow the new weights (1:1000). The stage's reader reads at most an eighth of
    its window past it (it read up to 256 more, whatever the window)."""
    import chute

    a = chute.MapDataset.range(10**5).map(_tag_a).to_iter_dataset()
    b = chute.MapDataset.range(10**5).map(_tag_b).to_iter_dataset()
    ds = chute.IterDataset.mix({"a": a, "b": b}, {"a": 1.0, "b": 1.0})
    ds = ds.batch_by_tokens(8, length_fn=_one, window_size=100, sort=False, batch_fn=list)
    it: Any = iter(ds)
    for _ in range(40):  # past the first chunks: the mixture is read 256 at a time
        next(it)
    chute.experimental.set_mix_weights(it, {"a": 1.0, "b": 1000.0})
    after = [x[0] for _ in range(60) for x in next(it)]
    late = after[100:]  # one window after the change: new weights only
    assert late.count("a") <= 5, (
        f"{late.count('a')} of {len(late)} elements one window after the weight change "
        "still came from the old weights"
    )


def _tag_a(i: int) -> tuple[str, int]:
    return ("a", i)


def _tag_b(i: int) -> tuple[str, int]:
    return ("b", i)


def _one(x: Any) -> int:
    return 1


_MIX = ("mix_iter", "dict", 40, 40, (1.0, 1.0), 0)
_CHANGE = ((2, (1.0, 9.0)),)

KNOWN_DEFECTS: tuple[KnownDefect, ...] = (
    KnownDefect(
        "1",
        "a mixture's new weights are lost on restore under a windowed stage",
        frozenset({"resume"}),
        _d1,
        (
            Case(
                Pipeline(_MIX, (), (("batch_by_tokens", 8, 10, False, None),), _CHANGE),
                restore=(5, Run(), Run()),
            ),
            Case(Pipeline(_MIX, (), (("bucket", 10, False),), _CHANGE), restore=(5, Run(), Run())),
            Case(
                Pipeline(_MIX, (), (("window_shuffle", 10, 0),), _CHANGE), restore=(6, Run(), Run())
            ),
            Case(
                Pipeline(
                    ("mix_iter", "dict", 60, 60, (1.0, 1.0), 0),
                    (),
                    (("pack", "first", 2),),
                    _CHANGE,
                ),
                restore=(3, Run(), Run()),
            ),
            Case(
                Pipeline(
                    _MIX, (), (("batch_by_tokens", 8, 10, False, None), ("prefetch", 4)), _CHANGE
                ),
                restore=(4, Run(), Run()),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "2",
        "per-stage produced counts depend on the worker count",
        frozenset({"stats"}),
        _d2,
        (
            Case(
                Pipeline(("range", 30), (), (("filter", 3), ("mp", False))),
                runs=(Run(), Run(2)),
                stats=True,
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "3",
        "bucket_by_sequence_length hands out short batches at every window's end",
        frozenset({"bucket_full"}),
        _d3,
        (Case(Pipeline(("range", 48), (), (("bucket", 6, False),))),),
        fixed=True,
    ),
    KnownDefect(
        "4",
        "a weight change reaches the mixture up to window_size + 256 positions late",
        frozenset(),  # no drawn invariant measures lateness; the example does
        lambda case: False,
        (_d4_weight_change_reaches_mix_late,),
        fixed=True,
    ),
    KnownDefect(
        "5",
        "set_weights rejects a weight of 0",
        frozenset({ALL}),
        _d5,
        (
            Case(
                Pipeline(_MIX, (), (("batch", 2, False),), ((3, (0.0, 1.0)),)),
                restore=(6, Run(), Run()),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "6",
        "two readers under one mp_prefetch, each behind its own prefetch thread, race",
        frozenset({ALL}),
        _d6,
        (
            Case(
                Pipeline(("mix_iter", "list", 40, 40, (1.0, 1.0), 3), (), (("mp", False),)),
                runs=(Run(), Run(2)),
            ),
            Case(
                Pipeline(("range", 40), (), (("prefetch", 3), ("mp", True))),
                runs=(Run(2), Run(2)),
                restore=(7, Run(2), Run(2)),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "7",
        "two mp_prefetch stages in one pipeline drop a filter",
        frozenset({ALL}),
        _d7,
        (
            Case(
                Pipeline(("range", 30), (), (("filter", 3), ("mp", False), ("mp", False))),
                runs=(Run(), Run(1)),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "8",
        "IterDataset.cache().repeat() over a mixture whose weights were changed",
        frozenset({"resume"}),
        _d8,
        (
            Case(
                Pipeline(
                    ("mix_iter", "dict", 10, 30, (1.0, 1.0), 0),
                    (),
                    (("cache",), ("repeat", 2)),
                    ((2, (1.0, 9.0)),),
                ),
                restore=(6, Run(), Run()),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "9",
        "the per-shard stages of a shard stream vanish from chute.stats with workers",
        frozenset({"stats"}),
        _d9,
        (
            Case(
                Pipeline(("jsonl", 3, 10, 2), (), (("map",),)),
                runs=(Run(), Run(2)),
                stats=True,
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "10",
        "chute.stats(iter(loader)) raises on a DataLoader's iterator in debug mode",
        frozenset({"stats"}),
        _d10,
        (Case(Loader(20, ops=(("batch", 4, False),)), stats=True),),
        fixed=True,
    ),
    KnownDefect(
        "new-1",
        "a stream that stops early counted the read-ahead of the stages above "
        "to_iter_dataset as produced, so the counts depended on the worker count "
        "(range(30).map(f).to_iter_dataset().limit(5): 17 with 0 workers, 5 with 1 or 2); "
        "they now count the reader's positions handed out (debug/handout.py)",
        frozenset({"stats"}),
        _new1,
        (
            Case(
                Pipeline(("range", 30), (), (("limit", 5), ("mp", False))),
                runs=(Run(), Run(1)),
                stats=True,
            ),
            Case(
                Pipeline(("mix_iter", "list", 20, 60, (1.0, 1.0), 0), (), (("mp", False),)),
                runs=(Run(), Run(2)),
                stats=True,
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "new-2",
        "a mixture's weight change made at or after the restored step, under a stage that "
        "reads ahead in windows (buckets, batch_by_tokens, packers), gives another stream "
        "than the uninterrupted run: the mix has drawn further ahead there than the restored "
        "run's replay, so the change lands at another draw position (long profile, seeds "
        "1796662464 and 1796662465)",
        frozenset({"resume"}),
        _new2,
        (
            Case(
                Pipeline(
                    ("mix_iter", "dict", 5, 5, (1.0, 1.0), 0),
                    (),
                    (("bucket", None, False),),
                    ((3, (0.0, 1.0)),),
                ),
                restore=(1, Run(), Run()),
            ),
            Case(
                Pipeline(
                    ("mix_iter", "dict", 5, 5, (1.0, 1.0), 0),
                    (),
                    (("bucket", None, False),),
                    ((0, (0.5, 0.0)), (1, (0.0, 1.0))),
                ),
                restore=(1, Run(), Run()),
            ),
            # Every stage that reads its input in chunks (ReplayReader): batch_by_tokens,
            # window shuffle, the packers.
            Case(
                Pipeline(_MIX, (), (("batch_by_tokens", 8, 10, False, None),), ((4, (1.0, 9.0)),)),
                restore=(4, Run(), Run()),
            ),
            Case(
                Pipeline(
                    ("mix_iter", "dict", 100, 100, (1.0, 1.0), 0),
                    (),
                    (("window_shuffle", 10, 0),),
                    ((12, (1.0, 9.0)),),
                ),
                restore=(11, Run(), Run()),
            ),
            Case(
                Pipeline(
                    ("mix_iter", "dict", 60, 60, (1.0, 1.0), 0),
                    (),
                    (("pack", "first", 2),),
                    ((4, (1.0, 9.0)),),
                ),
                restore=(2, Run(), Run()),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "new-3",
        "the stages below a MapDataset.cache() report other produced counts with workers "
        "(list(12).repeat(1).cache().repeat(2): source 14 with 0 workers, 13 with 1; long "
        "profile, seed 1796662464)",
        frozenset({"stats"}),
        _new3,
        (
            Case(
                Pipeline(
                    ("list", 12),
                    (("repeat", 1), ("cache",), ("repeat", 2), ("window_shuffle", 10, 2)),
                    (("window_shuffle", 11, 3),),
                ),
                runs=(Run(), Run(1)),
                restore=(19, Run(1), Run()),
                stats=True,
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "new-4",
        "a stage that reads its input in chunks and had met its end before a weight change, "
        "restored from a state taken after it, read on past that end: the new weights "
        "revived a mixture that had run dry in the uninterrupted run (long profile, seed "
        "1796670571)",
        frozenset({"resume"}),
        _new4,
        (
            Case(
                Pipeline(
                    ("mix_iter", "dict", 5, 5, "fn", 0),
                    (),
                    (("batch_by_tokens", 4, 5, False, None),),
                    ((0, (0.5, 0.0)), (1, (0.0, 1.0))),
                ),
                restore=(2, Run(), Run()),
            ),
            Case(
                Pipeline(
                    ("mix_iter", "dict", 3, 3, (1.0, 1.0), 0),
                    (),
                    (("bucket", None, False),),
                    ((0, (1.0, 0.0)), (2, (0.0, 1.0))),
                ),
                restore=(2, Run(), Run()),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "new-5",
        "a user stage written as docs/extending.md shows (its parent's state under a key of "
        "its own) over a mixture, under a windowed stage or a prefetch: the mixture's weight "
        "changes were left out of the state handed out, so the restored run kept the old "
        "weights (long profile, seeds 1796671694 and 1796673403)",
        frozenset({"resume"}),
        _new5,
        (
            Case(
                Pipeline(
                    ("mix_iter", "dict", 5, 5, "fn", 0),
                    (),
                    (("map",), ("stamp",), ("window_shuffle", 2, 0)),
                    ((1, (0.0, 1.0)),),
                ),
                runs=(Run(), Run()),
                restore=(2, Run(), Run()),
            ),
            # Under a prefetch thread: chute's own wrappers keep states of their own shape
            # too (their parent's whole), so the user stage's part was never looked at.
            Case(
                Pipeline(
                    ("mix_iter", "dict", 5, 5, (1.0, 1.0), 0),
                    (),
                    (("stamp",), ("prefetch", 1)),
                    ((1, (0.0, 1.0)),),
                ),
                runs=(Run(), Run()),
                restore=(2, Run(), Run()),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "new-6",
        "an IterDataset.cache() above a packer over a mixture: a weight change made after a "
        "restore, once the mixture had run dry in the uninterrupted run, still drew in the "
        "restored run (long profile, seed 1796673403). Two roots: the mixture did not stay "
        "ended (new weights revived it; a replay from before its end, here the cache's "
        "re-read of its pass, drew past it: the mixture's state now records its end), and "
        "a restored cache read its later pass lazily from the parent, so changes made "
        "during that pass reached the mixture mid-replay instead of at its end (the pass "
        "is now read whole when it starts)",
        frozenset({"resume"}),
        _new6,
        (
            Case(
                Pipeline(
                    ("mix_iter", "dict", 5, 5, "fn", 0),
                    (),
                    (("pack", "first", 1), ("map",), ("cache",), ("repeat", 2), ("map",)),
                    ((4, (0.0, 1.0)),),
                ),
                runs=(Run(), Run()),
                restore=(1, Run(), Run()),
            ),
        ),
        fixed=True,
    ),
    KnownDefect(
        "new-8",
        "new-1 left over: a stream that stops early still counts read-ahead (so counts "
        "that depend on the worker count) where it is not the reader's own positions: the "
        "parts of a MapDataset mixture, concatenation, select_from_datasets, cache or "
        "window shuffle under the reader are "
        "credited once their caller's whole block is handed out, and stages above the "
        "reader that read ahead themselves (an interleave's shards, prefetch threads) "
        "count what they read",
        frozenset({"stats"}),
        _new8,
        (
            Case(
                Pipeline(("mix_map", 40, 40, (1.0, 1.0)), (), (("limit", 7),)),
                runs=(Run(), Run(2)),
                stats=True,
            ),
            Case(
                Pipeline(("interleave", 2, 30, 1), (), (("limit", 4),)),
                runs=(Run(), Run(1)),
                stats=True,
            ),
            # The long run on 5d2053f, seed 1796684850: the same under select_from_datasets.
            Case(
                Pipeline(
                    ("select_map", 5, 5, 0, 3), (), (("batch", 1, False), ("even_batches", 2))
                ),
                runs=(Run(), Run(1)),
                restore=(0, Run(1), Run(1)),
                stats=True,
            ),
            # The same long run, its second round: a MapDataset window shuffle's window.
            Case(
                Pipeline(
                    ("range", 11), (("batch", 2, False), ("window_shuffle", 6, 1)), (("limit", 2),)
                ),
                runs=(Run(), Run(1)),
                stats=True,
            ),
        ),
    ),
    KnownDefect(
        "new-9",
        "a MapDataset flat map's parent counts an element it reads again as produced again: "
        "FlatMapMapDataset reads each parent element once per block of positions asked "
        "for, so an element whose parts fall in two blocks is read (and counted) twice, "
        "and where blocks split depends on the workers and on timing (range(10) with a "
        "flat map into 2 parts: the source reports 11 or 12 with 0 workers, 14 with 2; "
        "the output is right)",
        frozenset({"stats"}),
        _new9,
        (
            Case(
                Pipeline(("range", 10), (("flat_map", 2),), (("mp", False),)),
                runs=(Run(), Run(2)),
                stats=True,
            ),
            Case(Loader(10, False, 1, 1, (("flat_map", 2),)), runs=(Run(), Run(2)), stats=True),
        ),
    ),
    KnownDefect(
        "new-7",
        "the stages below an IterDataset.cache() replayed by a repeat counted the source "
        "read again with 0 workers: the cache rewound its parent to replay from memory, "
        "which started an interleave's read-ahead threads on the shards again "
        "(interleave(1 shard of 2).map().cache().repeat(2): source 4 with 0 workers, 2 "
        "with 1)",
        frozenset({"stats"}),
        _new7,
        (
            Case(
                Pipeline(("interleave", 1, 2, 1), (), (("map",), ("cache",), ("repeat", 2))),
                runs=(Run(workers=0), Run(workers=1)),
                restore=(0, Run(workers=1), Run(workers=0)),
                stats=True,
            ),
        ),
        fixed=True,
    ),
)


def open_defects() -> list[KnownDefect]:
    return [d for d in KNOWN_DEFECTS if not d.fixed]


def blocked(case: Case) -> bool:
    """Whether a known defect stops the whole case (the generative tests assume it away)."""
    return any(ALL in d.invariants and d.applies(case) for d in open_defects())


def skip_for(case: Case) -> Callable[[str], bool]:
    """The invariants known defects break for `case` (left out by the generative tests)."""
    broken = {i for d in open_defects() if d.applies(case) for i in d.invariants}
    return lambda invariant: invariant in broken
