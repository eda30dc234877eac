"""The documented exceptions to "the output does not depend on the worker count": ONE
table, read by the suite (`runner.check_case`). Each entry names the invariant it lifts,
when it applies, the reason, and the doc that states it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conformance.pipelines import Loader, Pipeline, Run


@dataclass(frozen=True)
class Documented:
    name: str
    invariants: frozenset[str]
    applies: Callable[[Pipeline | Loader, Run, Run], bool]
    reason: str
    doc: str


def _sequential_slice_other_count(p: Pipeline | Loader, a: Run, b: Run) -> bool:
    return isinstance(p, Pipeline) and p.sequential_slice() and a.workers != b.workers


def weights_in_flight(p: Pipeline | Loader) -> bool:
    """Weights changed between steps with a prefetch thread above the mixture."""
    return (
        isinstance(p, Pipeline)
        and bool(p.weight_changes)
        and any(o[0] == "prefetch" for o in p.iter_ops)
    )


EXCEPTIONS: tuple[Documented, ...] = (
    Documented(
        name="sequential_slice",
        invariants=frozenset({"workers", "resume", "stats"}),
        applies=_sequential_slice_other_count,
        reason=(
            "mp_prefetch(..., sequential_slice=True) asks for Grain's order for that many "
            "workers (InterleaveIterDataset over N copies): the order depends on "
            "num_workers, and its states restore only with the same N; its stages are "
            "those of the N copies"
        ),
        doc="docs/grain_differences.md (Behaviour: the output does not depend on the worker "
        "count); IterDataset.mp_prefetch's docstring",
    ),
    Documented(
        name="weights_in_flight",
        # "workers": two runs differ; "resume": the comparison with another run. The
        # resumed stream still equals the interrupted run's own continuation where every
        # change came before the state (runner: "resume" against the same run).
        invariants=frozenset({"workers", "resume_vs_reference"}),
        applies=lambda p, a, b: weights_in_flight(p),
        reason=(
            "a prefetch thread above IterDataset.mix has drawn its buffered elements with "
            "the weights before a change: the change reaches the consumer as many elements "
            "later as the thread had buffered, which depends on timing"
        ),
        doc="docs/sequences.md (Mixing: Elements in flight)",
    ),
)


def excepted(invariant: str, p: Any, a: Run, b: Run) -> bool:
    """Whether a documented exception lifts `invariant` between runs `a` and `b` of `p`."""
    return any(invariant in e.invariants and e.applies(p, a, b) for e in EXCEPTIONS)
