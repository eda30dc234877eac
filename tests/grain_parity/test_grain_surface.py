"""Every public name of Grain 0.2.18 exists in chute with a compatible signature, or is
listed in `docs/grain_differences.md` with the reason.

The walk: each public module of Grain below, each name in `dir(module)` not starting with
`_`; for a class, also each public method or property the class defines itself (in its
own `__dict__`: inherited ones are checked on the base). A Grain object reached under
several names (`grain.python` re-exports) has its signature checked once, under its first
name; chute must still have every name.

The rule for a compatible signature, so that a call written for Grain means the same:

1. chute accepts every parameter Grain names, under the same name;
2. a parameter Grain takes by position is at the same position in chute;
3. a parameter optional in Grain is optional in chute, and chute requires no parameter
   Grain does not have;
4. where Grain's default is a plain value (None, bool, int, float, str), chute's is the
   same (other defaults are Grain's internal markers);
5. `*args` / `**kwargs` in Grain are there in chute.

Keyword-only in chute where Grain also takes a parameter by position breaks rule 2. Names
listed in the doc's table (first column, `` `grain....` ``) are skipped; a listed name that
has become compatible makes the test fail, so the list stays true.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
import warnings
from pathlib import Path
from typing import Any

import pytest


def needs_grain() -> None:
    pytest.importorskip("grain", reason="grain 0.2.18 is not installed (it is in the `test` extra)")


GRAIN_MODULES = [
    "grain",
    "grain.experimental",
    "grain.checkpoint",
    "grain.transforms",
    "grain.samplers",
    "grain.sharding",
    "grain.sources",
    "grain.multiprocessing",
    "grain.constants",
    "grain.python",
    "grain.python.experimental",
]
DOC = Path(__file__).resolve().parents[2] / "docs" / "grain_differences.md"
P = inspect.Parameter
PLAIN = (type(None), bool, int, float, str)


def documented() -> set[str]:
    """The names in the first column of the doc's tables."""
    rows = re.findall(r"^\| *`(grain(?:\.\w+)+)`", DOC.read_text(), re.MULTILINE)
    return set(rows)


def signature(obj: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(obj)
    except (TypeError, ValueError):
        return None


def incompatibilities(theirs: Any, ours: Any) -> list[str]:
    """How a call written for `theirs` could fail or mean something else with `ours`."""
    g, c = signature(theirs), signature(ours)
    if g is None or c is None:
        return []
    problems = []
    cp = c.parameters
    kinds = {p.kind for p in cp.values()}
    g_pos = [
        p.name
        for p in g.parameters.values()
        if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
    ]
    c_pos = [p.name for p in cp.values() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    for p in g.parameters.values():
        if p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD):
            if p.kind not in kinds:
                problems.append(f"no {'*' if p.kind is P.VAR_POSITIONAL else '**'}{p.name}")
            continue
        q = cp.get(p.name)
        if q is None:
            problems.append(f"no parameter {p.name!r}")
            continue
        if p.name in g_pos:
            i = g_pos.index(p.name)
            if i >= len(c_pos) or c_pos[i] != p.name:
                problems.append(f"{p.name!r} is not positional parameter {i}")
        elif q.kind is P.POSITIONAL_ONLY:
            problems.append(f"{p.name!r} cannot be passed by keyword")
        if p.default is not P.empty:
            if q.default is P.empty:
                problems.append(f"{p.name!r} is required")
            elif isinstance(p.default, PLAIN) and (
                type(p.default) is not type(q.default) or p.default != q.default
            ):
                problems.append(f"{p.name!r} defaults to {q.default!r}, not {p.default!r}")
    for q in cp.values():
        required = q.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD) and q.default is P.empty
        if required and q.name not in g.parameters:
            problems.append(f"requires {q.name!r}")
    return problems


def chute_module(name: str) -> types.ModuleType:
    return importlib.import_module("chute" + name[len("grain") :])


def walk() -> list[tuple[str, Any, Any]]:
    """(Grain's name, Grain's object, chute's object or None), once per signature. A name
    whose Grain object was met before under another name (a `grain.python` re-export)
    comes with None for Grain's object and is listed as its first name."""
    out: list[tuple[str, Any, Any]] = []
    seen: dict[int, str] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module_name in GRAIN_MODULES:  # submodules as attributes, whatever ran before
            importlib.import_module(module_name)
            chute_module(module_name)
        for module_name in GRAIN_MODULES:
            module = importlib.import_module(module_name)
            ours_module = chute_module(module_name)
            for name in sorted(n for n in dir(module) if not n.startswith("_")):
                theirs = getattr(module, name)
                ours = getattr(ours_module, name, None)
                full = f"{module_name}.{name}"
                checked = id(theirs) in seen
                full = seen.setdefault(id(theirs), full) if checked else full
                seen.setdefault(id(theirs), full)
                out.append((full, theirs if not checked else None, ours))
                if checked or ours is None or not inspect.isclass(theirs):
                    continue
                for attr, raw in sorted(vars(theirs).items()):
                    if attr.startswith("_"):
                        continue
                    if not (
                        callable(raw) or isinstance(raw, (property, classmethod, staticmethod))
                    ):
                        continue
                    out.append((f"{full}.{attr}", getattr(theirs, attr), getattr(ours, attr, None)))
    return out


def problems_of(theirs: Any, ours: Any) -> list[str]:
    if ours is None:
        return ["missing"]
    if theirs is None or isinstance(theirs, (types.ModuleType, property)):
        return []
    if callable(theirs):
        return incompatibilities(theirs, ours)
    if isinstance(theirs, (*PLAIN, frozenset)) and theirs != ours:
        return [f"is {ours!r}, not {theirs!r}"]
    return []


def test_every_grain_name_is_in_chute_or_documented() -> None:
    needs_grain()
    skip = documented()
    failures = []
    for full, theirs, ours in walk():
        if full in skip:
            continue
        problems = problems_of(theirs, ours)
        if problems:
            failures.append(f"{full}: {'; '.join(problems)}")
    assert not failures, (
        "Grain names chute lacks or takes differently; add them, or list them with the "
        "reason in docs/grain_differences.md:\n" + "\n".join(failures)
    )


def test_documented_names_are_grains_and_still_differ() -> None:
    needs_grain()
    found: dict[str, list[str]] = {}
    for full, theirs, ours in walk():
        found.setdefault(full, []).extend(problems_of(theirs, ours))
    listed = documented()
    assert listed, "docs/grain_differences.md lists no names: the table was not found"
    unknown = sorted(listed - set(found))
    assert not unknown, f"the doc lists names Grain 0.2.18 does not have: {unknown}"
    stale = sorted(n for n in listed if found[n] == [])
    assert not stale, f"these documented names now match Grain; remove them from the doc: {stale}"


def test_the_examples_of_the_doc_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, "docs/grain_differences.md has no example"
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {"__name__": "grain_differences_md"})
