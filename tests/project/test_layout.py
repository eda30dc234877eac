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
- the floors, bottom up: `core/` (with `process_effects.py`), `storage/`, `ops/`, `exec/`,
  `frameworks/`, `debug/`. An import that runs (at module level or inside a function; not
  one under `if TYPE_CHECKING:`, which names a type and runs nothing) from a floor to a
  higher one is an arrow back up. The arrows back up are at most `MAX_BACK_ARROWS` pairs
  of floors, only those `BACK_ARROWS` lists:
  - core -> ops and core -> exec: the chain methods (`MapDataset.map`, ...) construct
    their operation through `core/chain.py`'s table, the one module of core that reaches
    up, and only through that table (its entries count as imports); elsewhere in core,
    only a chain method's return type (an ops class under `if TYPE_CHECKING:`) is named;
  - ops -> exec: `InterleaveIterDataset` reads its inputs on exec's thread pool, tuned by
    exec's hill climb;
- the import graph (the same imports, modules as nodes) has at most `MAX_CIRCLES` circle
  (a strongly connected set of more than one module): the chain methods' own.
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
FLOORS = {"core": 0, "process_effects": 0, "storage": 1, "ops": 2, "exec": 3}
FLOORS |= {"frameworks": 4, "debug": 5}
BACK_ARROWS = {("core", "ops"), ("core", "exec"), ("ops", "exec")}
MAX_BACK_ARROWS = 3
MAX_CIRCLES = 1
CHAIN = "core/chain.py"  # the chain methods' table: core's one way up


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
        if rel.startswith("core/"):
            for floor in UPPER_FLOORS:
                if not _within(imp.module, f"chute._src.{floor}"):
                    continue
                if floor == "ops" and imp.type_checking:
                    continue  # a chain method's return type
                found.append(f"{where}: core reaches up only through {CHAIN}'s table")
    return found


def _floor(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in FLOORS else None


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the modules it imports where that runs (not under TYPE_CHECKING), with
    the chain table's entries as imports of `core/chain.py`."""
    paths = sorted(root.rglob("*.py"))
    names = {_module_name(p, root) for p in paths}

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for path in paths:
        name = _module_name(path, root)
        targets = {resolve(i.module) for i in imports(path, root) if not i.type_checking}
        if path.relative_to(root).as_posix() == CHAIN:
            targets |= {resolve(f"chute._src.{m}") for m in chain_table(path).values()}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def chain_table(path: Path) -> dict[str, str]:
    """`OPERATIONS` of `core/chain.py`, read from its source."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "OPERATIONS" and node.value:
                table: dict[str, str] = ast.literal_eval(node.value)
                return table
    raise AssertionError(f"{path}: no OPERATIONS table")


def back_arrows(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(floor, higher floor) -> the imports that run that way, `a -> b` each."""
    found: dict[tuple[str, str], list[str]] = {}
    for a, targets in graph.items():
        for b in sorted(targets):
            fa, fb = _floor(a), _floor(b)
            if fa and fb and FLOORS[fb] > FLOORS[fa]:
                found.setdefault((fa, fb), []).append(f"{a} -> {b}")
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def test_arrows_back_up_are_the_listed_few() -> None:
    found = back_arrows(import_graph())
    assert len(BACK_ARROWS) <= MAX_BACK_ARROWS
    assert set(found) <= BACK_ARROWS, {k: v for k, v in found.items() if k not in BACK_ARROWS}
    core_up = [arrow for (fa, _), arrows in found.items() if fa == "core" for arrow in arrows]
    assert all(a.startswith("chute._src.core.chain -> ") for a in core_up), core_up


def test_at_most_one_circle_of_imports() -> None:
    found = circles(import_graph())
    assert len(found) <= MAX_CIRCLES, [c if len(c) < 12 else f"{len(c)} modules" for c in found]
    if found:  # the chain methods' own: core -> chain table -> an operation -> core
        assert "chute._src.core.chain" in found[0]


def test_the_chain_table_names_what_exists() -> None:
    from chute._src.core import chain

    assert chain_table(SRC / CHAIN) == chain.OPERATIONS
    for name in chain.OPERATIONS:
        assert callable(chain.operation(name)), name
    assert all(_floor(f"chute._src.{m}") in ("ops", "exec") for m in chain.OPERATIONS.values())


def test_the_graph_finds_circles_and_arrows(tmp_path: Path) -> None:
    root = tmp_path / "chute" / "_src"
    cases = {
        "core/a.py": "from chute._src.core import b\n",
        "core/b.py": "def f():\n    from chute._src.core import a\n",
        "core/chain.py": 'OPERATIONS: dict[str, str] = {"X": "ops.x"}\n',
        "ops/x.py": "from chute._src.core import chain\nfrom chute._src.exec import y\n",
        "exec/y.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from chute._src.ops import x\n",
    }
    for rel, text in cases.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    graph = import_graph(root)
    assert circles(graph) == [
        ["chute._src.core.a", "chute._src.core.b"],
        ["chute._src.core.chain", "chute._src.ops.x"],
    ]
    assert back_arrows(graph) == {
        ("core", "ops"): ["chute._src.core.chain -> chute._src.ops.x"],
        ("ops", "exec"): ["chute._src.ops.x -> chute._src.exec.y"],
    }


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
            f"core reaches up only through {CHAIN}'s table",
            f"core reaches up only through {CHAIN}'s table",
            f"core reaches up only through {CHAIN}'s table",
        ],
        "core/long.py": [f"{MAX_LINES + 1} lines, over {MAX_LINES}: split it along a seam"],
        "ops/fine.py": [],
    }
