"""pytest plugin for the runs of Grain's tests (loaded by `run.py` with `-p`).

Deselects the excluded test methods and writes one JSON line per test to the file named
by `CHUTE_GRAIN_RESULTS`: its file, class, method (the name in Grain's source, which
a parametrized case shares with its siblings), outcome and the first lines of its error.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

RESULTS_ENV = "CHUTE_GRAIN_RESULTS"
EXCLUDED_ENV = "CHUTE_GRAIN_EXCLUDED"


def method_name(item: pytest.Item) -> str:
    """The test method's name in Grain's source: absl's parametrized cases are copies
    made with `functools.wraps`, which keeps the original in `__wrapped__`."""
    obj = getattr(item, "obj", None)
    fn = getattr(obj, "__func__", obj)
    while fn is not None and getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else item.name.split("[")[0]


def method_key(item: pytest.Item) -> str:
    owner = getattr(item, "cls", None)
    cls = owner.__name__ if owner is not None else ""
    return f"{item.path.name}::{cls}::{method_name(item)}"


def pytest_configure(config: pytest.Config) -> None:
    """Parses absl's flags as Grain's Bazel runs do: `--test_srcdir` is Grain's
    `_src/python` (its test data), here under the shim's root."""
    from absl import flags
    from absl.testing import absltest  # noqa: F401 (defines --test_srcdir, --test_tmpdir)

    root = os.environ.get("CHUTE_GRAIN_SHIM_ROOT", "")
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(["pytest", f"--test_srcdir={os.path.join(root, 'grain', '_src', 'python')}"])


def _excluded() -> set[str]:
    path = os.environ.get(EXCLUDED_ENV)
    if not path:
        return set()
    with open(path) as f:
        return set(json.load(f))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    excluded = _excluded()
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        key = method_key(item)
        cls_key = key.rsplit("::", 1)[0]
        (drop if key in excluded or cls_key in excluded else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_outcomes: dict[str, dict[str, Any]] = {}


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    text = str(report.longrepr) if report.longrepr is not None else ""
    lines = [line for line in text.splitlines() if line.startswith("E ")]
    shown = "\n".join(lines[:6]) if lines else "\n".join(text.splitlines()[-6:])
    return shown[:1500]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _outcomes.setdefault(
        report.nodeid, {"outcome": "passed", "message": "", "seconds": 0.0}
    )
    entry["seconds"] += report.duration
    if report.skipped and report.when in ("setup", "call"):
        if entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
            entry["message"] = _message(report)
    elif report.failed and entry["outcome"] != "failed":
        entry["outcome"] = "failed"
        entry["message"] = f"[{report.when}] " + _message(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> Any:
    yield
    entry = _outcomes.pop(nodeid, None)
    if entry is None:
        return
    key = _keys.get(nodeid, "")
    file, cls, method = key.split("::") if key else (nodeid.split("::")[0], "", nodeid)
    _write(
        {
            "kind": "test",
            "nodeid": nodeid,
            "file": file,
            "class": cls,
            "method": method,
            "outcome": entry["outcome"],
            "message": entry["message"],
            "seconds": round(entry["seconds"], 2),
        }
    )


_keys: dict[str, str] = {}


def pytest_itemcollected(item: pytest.Item) -> None:
    _keys[item.nodeid] = method_key(item)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write({"kind": "collect_error", "nodeid": report.nodeid, "message": _message(report)})
