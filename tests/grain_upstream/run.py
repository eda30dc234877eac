"""Runs Grain 0.2.18's own unit tests against chute and counts what passes.

    python tests/grain_upstream/run.py [--jobs N] [--files a_test.py ...] [--failures]

Grain ships its tests (`grain/_src/**/*_test.py`) in its wheel. This copies them from the
installed package into a temporary directory and runs each file with pytest in a
subprocess in which `import grain` (and every private `grain._src...` module the tests
import) is answered by `shim.py` with chute's objects: the real Grain is never imported.

A test method passes when all its cases pass (absl's parametrized cases share the method);
a method whose cases were all skipped (Grain's own skips: no TensorFlow, ...) is not
counted. The applicable methods are all but those in `EXCLUDED`, each listed with why
it tests Grain's internals rather than its semantics. `KNOWN_DIFFERENCES` lists the
applicable methods that fail because chute deliberately behaves otherwise
(`docs/grain_differences.md`); they count as failures in the figures.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Test files, classes (`file::Class`) and methods (`file::Class::method`) left out, with
# why: they test parts of Grain with no counterpart in chute's API, not Grain's semantics.
EXCLUDED: dict[str, str] = {
    # Whole files.
    "jax_import_smoke_test.py": "checks that importing Grain does not import JAX",
    "tf_import_smoke_test.py": "checks that importing Grain does not import TensorFlow",
    "py_version_test.py": "checks Grain's CI ran the Python named by $PYTHON_VERSION",
    "autotune_test.py": "an empty placeholder (its one test is `pass`)",
    "device_put_test.py": "defines no test",
    "monitoring_test.py": "Grain's telemetry hooks (grain.monitoring; chute has chute.stats "
    "and chute.metrics instead, docs/grain_differences.md)",
    "prometheus_monitoring_test.py": "Grain's private Prometheus bridge for its telemetry "
    "(grain._src.core.prometheus_monitoring)",
    "multiprocessing_test.py": "Grain's 'endoscope' debugging registry of worker ports in "
    "shared memory (private names in grain._src.core.multiprocessing)",
    "parallel_test.py": "Grain's private thread-pool helper grain._src.core.parallel",
    "profiler_test.py": "Grain's worker profiler (grain._src.core.profiler)",
    "traceback_util_test.py": "Grain's private traceback filtering "
    "(grain._src.core.traceback_util)",
    "transforms_test.py": "get_pretty_transform_name, Grain's private naming of a transform "
    "in its debug summaries",
    "tree_lib_test.py": "Grain's private pytree library grain._src.core.tree_lib, not part "
    "of its API",
    "tree_lib_jax_test.py": "as tree_lib_test.py, with JAX's pytrees",
    "stats_test.py": "Grain's execution statistics internals: its protobuf summary "
    "(grain.proto), timers and weakref registries; chute's is chute.stats "
    "(docs/grain_differences.md)",
    "stats_utils_test.py": "helpers over Grain's protobuf execution summaries",
    "prefetch_autotune_test.py": "the private helpers of Grain's offline autotuner "
    "(_get_buffer_size, _find_prefetch_iter_dataset_parents, ...); chute has no "
    "PerformanceConfig and tunes while running (docs/grain_differences.md)",
    "grain_logging_test.py": "the absl log-line prefix of Grain's processes; skipped by "
    "Grain itself under pytest",
    "queue_test.py": "Grain's inter-process queue helpers (grain._src.python.ipc)",
    "variable_size_queue_test.py": "Grain's inter-process queue (grain._src.python.ipc)",
    "shared_memory_array_test.py": "Grain's shared-memory array internals "
    "(grain._src.python.ipc); chute decides by itself which arrays go through shared "
    "memory (docs/grain_differences.md)",
    # Classes and methods.
    "data_loader_test.py::CopyNumPyArrayToSharedMemoryTest": "Grain's private operation "
    "copying batches into shared memory inside its DataLoader",
    "batch_test.py::MakeBatchParallelTest": "Grain's private parallel batching "
    "(_MakeBatchParallel) and its shared-memory output",
    "base_test.py::IteratorContextTest": "Grain's private IteratorContext and "
    "MultiprocessingContext objects passed between its iterators",
    "dataset_test.py::GetExecutionSummaryTest": "Grain's protobuf execution summary (grain.proto)",
}

# Applicable test methods that fail because chute deliberately differs from Grain
# (`docs/grain_differences.md` gives each difference and its reason).
KNOWN_DIFFERENCES: dict[str, str] = {}


@dataclasses.dataclass
class FileResult:
    file: str
    methods: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # key -> outcomes
    messages: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> first error
    collect_error: str = ""
    seconds: float = 0.0
    rc: int = 0

    def method_outcome(self, key: str) -> str:
        outcomes = [o for o in self.methods[key] if o != "skipped"]
        if not outcomes:
            return "skipped"
        return "passed" if all(o == "passed" for o in outcomes) else "failed"

    def counts(self) -> tuple[int, int, int, int]:
        """(methods applicable, methods passed, tests applicable, tests passed)."""
        m = mp = t = tp = 0
        for key, outcomes in self.methods.items():
            outcome = self.method_outcome(key)
            if outcome == "skipped":
                continue
            m += 1
            mp += outcome == "passed"
            ran = [o for o in outcomes if o != "skipped"]
            t += len(ran)
            tp += sum(o == "passed" for o in ran)
        return m, mp, t, tp


def grain_package_dir() -> Path:
    """Where the installed Grain lives; its files are read, it is never imported."""
    spec = importlib.util.find_spec("grain")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "grain is not installed: the harness copies Grain's tests from its package "
            "(pip install grain==0.2.18)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def test_files(grain_dir: Path) -> list[Path]:
    return sorted(grain_dir.glob("_src/**/*_test.py"))


def _is_excluded_file(name: str) -> bool:
    return name in EXCLUDED


def _static_method_count(path: Path) -> list[str]:
    """The test methods a file defines, read from its source: counted as failed when the
    file cannot even be collected."""
    tree = ast.parse(path.read_text())
    keys = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                    keys.append(f"{path.name}::{node.name}::{item.name}")
    return keys


def prepare(workdir: Path, grain_dir: Path) -> Path:
    """Lays out the run: the shim's root (Grain's test data and test-code modules, the
    list of Grain's modules), the test files and the pytest configuration."""
    root = workdir / "root"
    tests = workdir / "tests"
    site = workdir / "site"
    for d in (root, tests, site):
        d.mkdir(parents=True)
    names = []
    for path in sorted(grain_dir.rglob("*.py")):
        rel = path.relative_to(grain_dir.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    (root / "grain_modules.txt").write_text("\n".join(names) + "\n")
    sys.path.insert(0, str(HERE))
    import shim

    sys.path.remove(str(HERE))
    for module in shim.TEST_CODE_MODULES:
        rel = Path(*module.split(".")).with_suffix(".py")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(grain_dir.parent / rel, root / rel)
    testdata = grain_dir / "_src" / "python" / "testdata"
    if testdata.is_dir():
        shutil.copytree(testdata, root / "grain" / "_src" / "python" / "testdata")
    for path in test_files(grain_dir):
        shutil.copy(path, tests / path.name)
    (site / "sitecustomize.py").write_text(
        "import importlib.util, sys\n"
        f"_spec = importlib.util.spec_from_file_location('chute_grain_shim', {str(HERE / 'shim.py')!r})\n"
        "_shim = importlib.util.module_from_spec(_spec)\n"
        "sys.modules['chute_grain_shim'] = _shim\n"
        "_spec.loader.exec_module(_shim)\n"
        "_shim.install()\n"
    )
    (tests / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    excluded = sorted(k for k in EXCLUDED if "::" in k)
    (workdir / "excluded.json").write_text(json.dumps(excluded))
    return tests


def run_file(workdir: Path, name: str, timeout: float) -> FileResult:
    tests = workdir / "tests"
    results = workdir / f"{name}.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(workdir / "site"), str(tests), str(HERE)]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["CHUTE_GRAIN_SHIM_ROOT"] = str(workdir / "root")
    env["CHUTE_GRAIN_RESULTS"] = str(results)
    env["CHUTE_GRAIN_EXCLUDED"] = str(workdir / "excluded.json")
    env.setdefault("JAX_PLATFORMS", "cpu")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "plugin",
        "-c",
        str(tests / "pytest.ini"),
        "--rootdir",
        str(tests),
        "--timeout=120",
        "-W",
        "ignore::DeprecationWarning",
        str(tests / name),
    ]
    start = time.monotonic()
    out = FileResult(file=name)
    try:
        proc = subprocess.run(
            cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=timeout
        )
        out.rc = proc.returncode
        tail = proc.stdout[-3000:] + proc.stderr[-3000:]
    except subprocess.TimeoutExpired:
        out.rc = -1
        tail = f"the file's run took over {timeout:.0f} s"
    out.seconds = time.monotonic() - start
    records = []
    if results.exists():
        records = [json.loads(line) for line in results.read_text().splitlines() if line]
    for r in records:
        if r["kind"] == "collect_error":
            out.collect_error = r["message"] or "collection failed"
            continue
        key = f"{r['file']}::{r['class']}::{r['method']}"
        out.methods.setdefault(key, []).append(r["outcome"])
        if r["outcome"] == "failed" and key not in out.messages:
            out.messages[key] = r["message"]
    if not out.methods:
        # Nothing ran (collection failed, or the process died first): each method the
        # file defines counts as one failed test.
        reason = out.collect_error or f"no test ran (exit {out.rc}):\n{tail}"
        out.collect_error = reason
        for key in _static_method_count(tests / name):
            if key in EXCLUDED or key.rsplit("::", 1)[0] in EXCLUDED:
                continue
            out.methods[key] = ["failed"]
            out.messages[key] = reason[:1500]
    elif out.rc not in (0, 1, 5):
        out.collect_error = f"pytest exited {out.rc}:\n{tail}"
    return out


def run(
    files: Sequence[str] | None = None, jobs: int = 1, timeout: float = 900
) -> list[FileResult]:
    grain_dir = grain_package_dir()
    with tempfile.TemporaryDirectory(prefix="chute-grain-tests-") as tmp:
        workdir = Path(tmp)
        prepare(workdir, grain_dir)
        names = [p.name for p in test_files(grain_dir) if not _is_excluded_file(p.name)]
        if files:
            unknown = sorted(set(files) - {p.name for p in test_files(grain_dir)})
            if unknown:
                raise ValueError(f"not among Grain's test files: {unknown}")
            names = [n for n in names if n in files]
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(lambda n: run_file(workdir, n, timeout), names))


@dataclasses.dataclass
class Totals:
    methods: int
    methods_passed: int
    tests: int
    tests_passed: int
    failing: dict[str, str]  # method key -> first error

    @property
    def method_rate(self) -> float:
        return self.methods_passed / self.methods if self.methods else 0.0

    @property
    def test_rate(self) -> float:
        return self.tests_passed / self.tests if self.tests else 0.0

    @property
    def unexpected(self) -> dict[str, str]:
        return {k: v for k, v in self.failing.items() if k not in KNOWN_DIFFERENCES}


def totals(results: Iterable[FileResult]) -> Totals:
    m = mp = t = tp = 0
    failing = {}
    for r in results:
        a, b, c, d = r.counts()
        m, mp, t, tp = m + a, mp + b, t + c, tp + d
        for key in r.methods:
            if r.method_outcome(key) == "failed":
                failing[key] = r.messages.get(key, "")
    return Totals(m, mp, t, tp, failing)


def report(results: list[FileResult], show_failures: bool) -> str:
    lines = [
        f"{'file':44} {'methods':>8} {'passed':>7} {'tests':>6} {'passed':>7} {'s':>6}",
    ]
    for r in results:
        m, mp, t, tp = r.counts()
        note = "  (collection: see failures)" if r.collect_error else ""
        lines.append(f"{r.file:44} {m:8} {mp:7} {t:6} {tp:7} {r.seconds:6.1f}{note}")
    tot = totals(results)
    lines.append(
        f"{'TOTAL':44} {tot.methods:8} {tot.methods_passed:7} {tot.tests:6} {tot.tests_passed:7}"
    )
    lines.append(
        f"applicable methods passed: {tot.methods_passed}/{tot.methods} "
        f"({100 * tot.method_rate:.1f} %); tests passed: {tot.tests_passed}/{tot.tests} "
        f"({100 * tot.test_rate:.1f} %)"
    )
    known = sorted(set(tot.failing) & set(KNOWN_DIFFERENCES))
    lines.append(
        f"failing methods: {len(tot.failing)} ({len(known)} known deliberate differences, "
        f"{len(tot.unexpected)} others)"
    )
    if show_failures:
        for key, message in sorted(tot.failing.items()):
            tag = "KNOWN" if key in KNOWN_DIFFERENCES else "FAIL"
            lines.append(f"\n{tag} {key}\n    " + message.replace("\n", "\n    "))
        for r in results:
            if r.collect_error:
                lines.append(f"\nCOLLECTION {r.file}\n    " + r.collect_error[:3000])
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="files run at once")
    parser.add_argument("--files", nargs="*", help="only these test files (by name)")
    parser.add_argument("--failures", action="store_true", help="print each failure")
    parser.add_argument("--json", help="also write the per-method outcomes here")
    args = parser.parse_args(argv)
    results = run(args.files, jobs=args.jobs)
    print(report(results, args.failures))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {r.file: {k: r.method_outcome(k) for k in r.methods} for r in results},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
