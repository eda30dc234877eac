"""The layout of `chute._src`: module size and which floor may import which.

Read from the source (the AST of every module under `src/chute/_src`), so an import is
seen wherever it is written: at module level, under `if TYPE_CHECKING:`, or inside a
function. The rules:

- no module has more than `MAX_LINES` lines;
- only `_src/debug/` imports the debug layer (`chute._src.debug`): the engine reaches it
  through `core/observe.py`, and the public modules (`src/chute/*.py`, not scanned here)
  may import it;
- `_src/storage/` imports nothing from `chute._src.exec`;
- `_src/exec/mp/` imports nothing from `chute._src.storage`;
- `_src/core/` imports nothing from ops, exec, storage, debug or frameworks at module
  level. Imports inside functions are allowed there: the chain methods
  (`MapDataset.map`, ...) import their operation from `ops/` when called. So is naming an
  operation's class under `if TYPE_CHECKING:`, for the type a chain method returns
  (`MapDataset.cache` returns a `CacheMapDataset`): no code runs it.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "chute" / "_src"
MAX_LINES = 600
UPPER_FLOORS = ("ops", "exec", "storage", "debug", "frameworks")


@dataclasses.dataclass(frozen=True)
class Import:
    module: str  # the absolute name of what is imported (a module, or a name in one)
    line: int
    in_function: bool
    type_checking: bool


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, root: Path = SRC) -> Iterator[Import]:
    """Every import statement in `path` (a module under `root`, a `chute/_src` folder),
    with the absolute name of each thing it imports (`from a import b` gives `a.b`: `b` may
    be a module or a name in `a`)."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            fn = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(alias.name, child.lineno, fn, type_checking)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    module = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    module = child.module or ""
                for alias in child.names:
                    yield Import(f"{module}.{alias.name}", child.lineno, fn, type_checking)
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), fn, True)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), fn, type_checking)
            else:
                yield from visit(child, fn, type_checking)

    yield from visit(ast.parse(path.read_text(), str(path)), False, False)


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _within(imported: str, package: str) -> bool:
    return imported == package or imported.startswith(package + ".")


def violations(path: Path, root: Path = SRC) -> list[str]:
    """What in `path` (a module under `root`) breaks the rules of the module docstring,
    one line each."""
    rel = path.relative_to(root).as_posix()
    found = []
    lines = len(path.read_text().splitlines())
    if lines > MAX_LINES:
        found.append(f"{rel}: {lines} lines, over {MAX_LINES}: split it along a seam")
    for imp in imports(path, root):
        where = f"{rel}:{imp.line} imports {imp.module}"
        if not rel.startswith("debug/") and _within(imp.module, "chute._src.debug"):
            found.append(f"{where}: only _src/debug/ imports the debug layer")
        if rel.startswith("storage/") and _within(imp.module, "chute._src.exec"):
            found.append(f"{where}: storage imports nothing from exec")
        if rel.startswith("exec/mp/") and _within(imp.module, "chute._src.storage"):
            found.append(f"{where}: exec/mp imports nothing from storage")
        if rel.startswith("core/") and not imp.in_function:
            for floor in UPPER_FLOORS:
                if not _within(imp.module, f"chute._src.{floor}"):
                    continue
                if floor == "ops" and imp.type_checking:
                    continue  # a chain method's return type
                found.append(
                    f"{where}: core imports from {floor}/ only inside functions"
                    + ("" if floor != "ops" else " (or, for a type, under TYPE_CHECKING)")
                )
    return found


def test_the_scan_sees_every_floor() -> None:
    modules = {p.relative_to(SRC).parts[0] for p in _modules()}
    assert {"core", "ops", "exec", "storage", "debug", "frameworks"} <= modules


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(SRC).as_posix())
def test_module_keeps_to_its_floor(path: Path) -> None:
    assert violations(path) == []


def test_the_rules_catch_each_kind_of_import(tmp_path: Path) -> None:
    """The checks, on modules written to break each rule in a tree of the same shape, find
    what they should and nothing else."""
    root = tmp_path / "chute" / "_src"
    cases = {
        "exec/debug_user.py": "def f():\n    import chute._src.debug.stats\n",
        "storage/formats/exec_user.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from chute._src.exec.autotune import HillClimb\n",
        "exec/mp/storage_user.py": "from ...storage.remote import blocks\n",
        "core/upper_user.py": "from chute._src.exec import reader\n"
        "if TYPE_CHECKING:\n    from chute._src.ops.cache import CacheMapDataset\n"
        "    from chute._src.storage import formats\n"
        "def chain():\n    from chute._src.ops.map import MapMapDataset\n",
        "core/long.py": "x = 1\n" * (MAX_LINES + 1),
        "ops/fine.py": "from chute._src.exec import autotune\nfrom chute._src.core import node\n",
    }
    found = {}
    for rel, text in cases.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        found[rel] = [v.split(": ", 1)[1] for v in violations(path, root)]
    assert found == {
        "exec/debug_user.py": ["only _src/debug/ imports the debug layer"],
        "storage/formats/exec_user.py": ["storage imports nothing from exec"],
        "exec/mp/storage_user.py": ["exec/mp imports nothing from storage"],
        "core/upper_user.py": [
            "core imports from exec/ only inside functions",
            "core imports from storage/ only inside functions",
        ],
        "core/long.py": [f"{MAX_LINES + 1} lines, over {MAX_LINES}: split it along a seam"],
        "ops/fine.py": [],
    }
