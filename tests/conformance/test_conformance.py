"""The generative conformance suite (issue 47): pipelines drawn from a grammar over the
public operations, run every way, checked against chute's promises.

Each drawn case runs in the reference way (no workers, no threads), one or two other ways,
and is interrupted once: a state taken at a random step, through JSON, restored into a
fresh pipeline run another way (`runner.py` lists the invariants). The known defects of
`known_defects.py` are left out here exactly where they apply; their examples run in
`test_known_defects.py`. Budgets: `profiles.py` (CHUTE_CONFORMANCE=long for the long run).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from conformance import pipelines as pl
from conformance import strategies as cst
from conformance.known_defects import blocked, skip_for
from conformance.pipelines import Env, Loader, Pipeline, Run
from conformance.profiles import LONG, budget
from conformance.runner import Case, InvalidDraw, check_case

# pytest-timeout's 300 s (pyproject) is per test; a generative test runs many cases, and in
# the long profile a failing case with workers takes minutes to shrink.
pytestmark = pytest.mark.timeout(3600 if LONG else 900)


@pytest.fixture(scope="session")
def conformance_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    yield Env(tmp_path_factory.mktemp("conformance"))


def run_case(case: Case, env: Env) -> None:
    """Checks `case`, less what a known defect breaks; logs what it checked (coverage)."""
    assume(not blocked(case))
    checked: list[str] = []
    try:
        check_case(case, env, skip=skip_for(case), on_check=checked.append)
    except InvalidDraw:
        assume(False)
    log = os.environ.get("CHUTE_CONFORMANCE_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(describe(case, checked)) + "\n")


def describe(case: Case, checked: list[str]) -> dict[str, object]:
    """What a case exercised: its operations, execution modes, events and invariants."""
    p = case.pipeline
    ops = p.ops_names() if isinstance(p, Loader) else p.ops()
    modes = set()
    for r in case.all_runs():
        modes.add("DataLoader" if isinstance(p, Loader) and not r.workers else r.mode())
        if isinstance(p, Loader) and r.workers:
            modes.add(f"DataLoader {r.workers} workers")
        if r.threads and isinstance(p, Pipeline):
            modes.add("threads")
    events = []
    if case.restore is not None and "resume" in checked:
        events.append("restore")
        if case.restore[1].workers != case.restore[2].workers:
            events.append("restore into other workers")
    if isinstance(p, Pipeline) and p.weight_changes:
        events.append("weights changed")
    return {"ops": ops, "modes": sorted(modes), "events": events, "checked": sorted(set(checked))}


# Every failure the suite found that is fixed stays here as an explicit example (those
# still open are in known_defects.py, with the same cases).
@example(
    case=Case(
        Pipeline(("range", 20), (("shuffle", 1),), (("batch", 4, False),)),
        runs=(Run(), Run(0, 2)),
        restore=(2, Run(), Run(0, 1)),
    )
)
@budget(ci=200, long=600)
@given(case=cst.cases(workers=[0]))
def test_in_process(case: Case, conformance_env: Env) -> None:
    """No worker processes: threads, both dataset types, every operation, every event."""
    run_case(case, conformance_env)


@budget(ci=30, long=100)
@given(case=cst.loader_cases(workers=[0]))
def test_dataloader_in_process(case: Case, conformance_env: Env) -> None:
    run_case(case, conformance_env)


@pytest.mark.slow
@budget(ci=30, long=120)
@given(case=cst.cases(workers=[0, 1, 2]))
def test_worker_processes(case: Case, conformance_env: Env) -> None:
    """0, 1 and 2 worker processes, states restored into another count."""
    run_case(case, conformance_env)


# Every source and operation at least in every mode: the sweep forces each one into the
# drawn pipelines (the free draws above reach the rare ones only now and then).
MUSTS = [
    *(f"source:{k}" for k in (*pl.MAP_SOURCES, *pl.ITER_SOURCES)),
    *(f"map:{k}" for k in pl.MAP_OPS),
    *(f"iter:{k}" for k in pl.ITER_OPS),
]


@pytest.mark.parametrize("must", MUSTS)
@budget(ci=3, long=20)
@given(data=st.data())
def test_each_operation_in_process(must: str, data: st.DataObject, conformance_env: Env) -> None:
    run_case(data.draw(cst.cases(workers=[0], must=must)), conformance_env)


@pytest.mark.slow
@pytest.mark.parametrize("must", MUSTS)
@budget(ci=2, long=8)
@given(data=st.data())
def test_each_operation_with_workers(must: str, data: st.DataObject, conformance_env: Env) -> None:
    run_case(data.draw(cst.cases(workers=[1, 2], must=must)), conformance_env)


@pytest.mark.parametrize("must", pl.LOADER_OPS)
@budget(ci=3, long=20)
@given(data=st.data())
def test_each_loader_operation_in_process(
    must: str, data: st.DataObject, conformance_env: Env
) -> None:
    """Every DataLoader operation forced into the drawn loaders (as MUSTS above)."""
    run_case(data.draw(cst.loader_cases(workers=[0], must=must)), conformance_env)


@pytest.mark.slow
@pytest.mark.parametrize("must", pl.LOADER_OPS)
@budget(ci=1, long=8)
@given(data=st.data())
def test_each_loader_operation_with_workers(
    must: str, data: st.DataObject, conformance_env: Env
) -> None:
    run_case(data.draw(cst.loader_cases(workers=[1, 2], must=must)), conformance_env)


@pytest.mark.slow
@budget(ci=6, long=30)
@given(case=cst.loader_cases(workers=[0, 1, 2]))
def test_dataloader_workers(case: Case, conformance_env: Env) -> None:
    run_case(case, conformance_env)


@pytest.mark.slow
@pytest.mark.skipif(not LONG, reason="Ray workers run in the long profile only")
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
@budget(ci=1, long=15)
@given(case=cst.cases(workers=[1, 2], stats=False, backend="ray"))
def test_ray_workers(case: Case, conformance_env: Env, local_ray: None) -> None:
    run_case(case, conformance_env)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """The local Ray instance RayWorkers starts, shut down after the test."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()
