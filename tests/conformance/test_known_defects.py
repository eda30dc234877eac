"""The explicit examples of `known_defects.KNOWN_DEFECTS`, each run with no invariant left
out. An open defect's examples carry `xfail(strict=False)` naming it, from the table
(the one place to remove them as fixes land); a fixed one's run as plain regressions.
Examples that start worker processes are marked slow."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conformance.known_defects import KNOWN_DEFECTS, KnownDefect
from conformance.pipelines import Env
from conformance.runner import Case, check_case


@pytest.fixture(scope="session")
def conformance_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield Env(tmp_path_factory.mktemp("conformance"))


def _params() -> list[Any]:
    out = []
    for d in KNOWN_DEFECTS:
        for k, ex in enumerate(d.examples):
            marks: list[Any] = []
            if not d.fixed:
                marks.append(pytest.mark.xfail(strict=False, reason=d.reason()))
            if isinstance(ex, Case) and any(w > 0 for w in ex.worker_counts()):
                marks.append(pytest.mark.slow)
            out.append(pytest.param(d, ex, id=f"defect-{d.key}-{k}", marks=marks))
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("defect", "example"), _params())
def test_known_defect_example(defect: KnownDefect, example: Any, conformance_env: Env) -> None:
    if isinstance(example, Case):
        assert defect.applies(example) or not defect.invariants, (
            f"the table's predicate for defect {defect.key} misses its own example"
        )
        check_case(example, conformance_env)
    else:
        example(conformance_env)
