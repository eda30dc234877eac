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

Over the whole graph (imports that run, in functions too; not those under TYPE_CHECKING):

- the floors, bottom up, are `FLOORS`, then the public modules (`chute.*`); an import that
  runs back up a floor is one of `UP_ARROWS` (today's, each with its reason; issue 51's
  target is at most 3);
- there are at most `MAX_CIRCLES` import circles (today's; issue 51's target is 1).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "chute" / "_src"
MAX_LINES = 600
UPPER_FLOORS = ("ops", "exec", "storage", "debug", "frameworks")
FLOORS = ("core", "storage", "exec", "ops", "frameworks", "debug")
PUBLIC = "chute"  # the public modules, above every floor (not `chute._native`: a leaf)
UP_ARROWS = {
    # the chain methods (`MapDataset.map`, ...) build their operation, in functions
    ("core", "ops"): "chain methods",
    ("core", "exec"): "chain methods (`to_iter_dataset`, `mp_prefetch`)",
    ("exec", "ops"): "the reader's filter check; sequential_slice's interleave",
    ("storage", "ops"): "streamed file sources subclass InterleaveIterDataset",
    ("storage", PUBLIC): "conversion reads its inputs through chute.sources",
}
MAX_CIRCLES = 3


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


def _floor(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["chute", "_src"]:
        return parts[2] if len(parts) > 2 and parts[2] in FLOORS else None
    return PUBLIC if parts[0] == "chute" and parts[1:2] != ["_native"] else None


def graph(paths: Iterable[Path], root: Path = SRC) -> dict[str, set[str]]:
    """module -> the modules under `root` it imports (imports that run: in functions too,
    not under TYPE_CHECKING); `from a import b` is an arrow to `a.b` where that is a
    module, else to `a`."""
    names = {_module_name(p, root): p for p in paths}
    arrows: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        for imp in imports(path, root):
            target = imp.module
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and not imp.type_checking and not _within(name, target):
                arrows[name].add(target)
    return arrows


def up_arrows(paths: Iterable[Path], root: Path = SRC) -> dict[tuple[str, str], set[str]]:
    """(floor, the higher floor it imports) -> the modules that do, for every import that
    runs back up a floor (`FLOORS`, then the public modules)."""
    order = [*FLOORS, PUBLIC]
    found: dict[tuple[str, str], set[str]] = {}
    for path in paths:
        name = _module_name(path, root)
        here = _floor(name)
        for imp in imports(path, root):
            there = _floor(imp.module)
            if here and there and not imp.type_checking and order.index(there) > order.index(here):
                found.setdefault((here, there), set()).add(name)
    return found


def circles(arrows: dict[str, set[str]]) -> list[set[str]]:
    """The import circles: the strongly connected sets of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    for start in arrows:
        if start in index:
            continue
        work = [(start, iter(sorted(arrows[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, todo = work[-1]
            nxt = next((t for t in todo if t not in index or t in stack), None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = set(stack[stack.index(node) :])
                    del stack[stack.index(node) :]
                    if len(members) > 1:
                        found.append(members)
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                work.append((nxt, iter(sorted(arrows.get(nxt, ())))))
            else:
                low[node] = min(low[node], index[nxt])
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


def test_imports_back_up_a_floor_are_the_known_ones() -> None:
    found = up_arrows(_modules())
    new = {arrow: sorted(found[arrow]) for arrow in found.keys() - UP_ARROWS.keys()}
    assert not new, f"imports back up a floor ({' < '.join([*FLOORS, PUBLIC])}): {new}"


def test_import_circles_do_not_grow() -> None:
    found = sorted(circles(graph(_modules())), key=len, reverse=True)
    assert len(found) <= MAX_CIRCLES, [sorted(c) for c in found]


def test_the_graph_rules_catch_a_circle_and_an_arrow_back_up(tmp_path: Path) -> None:
    root = tmp_path / "chute" / "_src"
    cases = {
        "core/a.py": "def f():\n    from chute._src.ops import b\n",
        "ops/b.py": "from chute._src.core import a\nfrom chute._src.core.c import X\n",
        "core/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from chute._src.ops import b\n",
        "storage/d.py": "import chute._native\nfrom chute import sources\n",
        "exec/e.py": "from chute._src.exec import f\n",
        "exec/f.py": "from . import e\n",
    }
    for rel, text in cases.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    paths = sorted(root.rglob("*.py"))
    assert up_arrows(paths, root) == {
        ("core", "ops"): {"chute._src.core.a"},
        ("storage", PUBLIC): {"chute._src.storage.d"},
    }
    assert sorted(sorted(c) for c in circles(graph(paths, root))) == [
        ["chute._src.core.a", "chute._src.ops.b"],
        ["chute._src.exec.e", "chute._src.exec.f"],
    ]
