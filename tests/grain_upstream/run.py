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
    "dataset_test.py::WithOptionsIterDatasetTest": "reads the options through the private `_ctx` and `_parents` of Grain's iterators (what the options do is tested in filter_test.py and prefetch_test.py)",
    "dataset_test.py::DatasetTest::test_mp_prefetch_switches_to_threads_for_free_threaded_python": "mocks Grain's private multiprocess_prefetch for free-threaded Python builds",
    "dataset_test.py::DatasetTest::test_seed_results_in_the_same_default_seed": "reads the private `_default_seed` of Grain's datasets",
    "filter_test.py::FilterValidatorTest": "Grain's private FilterThresholdChecker class",
    "map_test.py::RngPoolTest": "Grain's private RNG-pool helper _reset_rng_state (chute has no RngPool: docs/grain_differences.md)",
    "mix_test.py::ConcatenateLazyMapTest::test_concat_selection_map": "Grain's private _ConcatSelectionMap class",
    "mix_test.py::ConcatenateLazyMapTest::test_cannot_concatenate_infinite_datasets": "builds Grain's private _ConcatSelectionMap",
    "batch_test.py::MakeBatchTest::test_batch_single_value_parallel_batch_enabled_success": "Grain's private parallel batching (_MakeBatchParallel)",
    "batch_test.py::MakeBatchTest::test_batch_two_values_parallel_batch_enabled_success": "Grain's private parallel batching (_MakeBatchParallel)",
    "batch_test.py::MakeBatchTest::test_batch_non_numpy_values": "Grain's private parallel batching (_MakeBatchParallel)",
    "batch_test.py::MakeBatchTest::test_batch_different_shapes_parallel_batch_enabled_error": "Grain's private parallel batching (_MakeBatchParallel)",
    "batch_test.py::MakeBatchTest::test_batch_different_structures_parallel_batch_enabled_error": "Grain's private parallel batching (_MakeBatchParallel)",
    "batch_test.py::StringTruncationTest": "make_batch into Grain's shared memory (output_to_shared_memory=, _MakeBatchParallel, enable_shared_memory_output)",
    "batch_test.py::BatchIterDatasetTest::test_batch_shared_memory": "Grain's private enable_shared_memory_output of its batch stage",
    "batch_test.py::BatchIterDatasetTest::test_dataloader_enables_shared_memory_on_batch_dataset": "reads the private `_batch_fn` Grain's DataLoader switches to shared memory",
    "packing_test.py::FirstFitPackIterDatasetTest::test_get_packed_batch_size_bytes": "the private byte count of Grain's PackingDatasetIterator",
    "packing_test.py::FirstFitPackIterDatasetTest::test_get_packed_batch_size_bytes_before_next": "the private byte count of Grain's PackingDatasetIterator",
    "packing_test.py::BestFitPackIterDatasetTest::test_get_packed_batch_size_bytes": "the private byte count of Grain's PackingDatasetIterator",
    "packing_test.py::BestFitPackIterDatasetTest::test_get_packed_batch_size_bytes_before_next": "the private byte count of Grain's PackingDatasetIterator",
    "prefetch_test.py::PrefetchIterDatasetTest::test_prefetch_does_not_buffer_unnecessary_elements": "reads the private `_buffer` of Grain's prefetch iterator",
    "prefetch_test.py::PrefetchIterDatasetTest::test_set_prefetch_buffer_size_0_to_positive": "Grain's private `_set_prefetch_buffer_size` and `_buffer` (chute tunes its buffer itself: chute.AUTOTUNE)",
    "prefetch_test.py::PrefetchIterDatasetTest::test_set_prefetch_buffer_size_decrease": "Grain's private `_set_prefetch_buffer_size` and `_buffer`",
    "prefetch_test.py::PrefetchIterDatasetTest::test_set_prefetch_buffer_size_increase": "Grain's private `_set_prefetch_buffer_size` and `_buffer`",
    "prefetch_test.py::PrefetchIterDatasetTest::test_set_prefetch_buffer_size_positive_to_0": "Grain's private `_set_prefetch_buffer_size` and `_buffer`",
    "prefetch_test.py::PrefetchIterDatasetTest::test_set_num_threads_decrease_threads": "Grain's private `_set_num_threads` of its prefetch iterator (chute tunes its threads itself: chute.AUTOTUNE)",
    "prefetch_test.py::PrefetchIterDatasetTest::test_set_num_threads_decrease_to_zero": "Grain's private `_set_num_threads` of its prefetch iterator",
    "prefetch_test.py::PrefetchIterDatasetTest::test_set_num_threads_increase_from_zero": "Grain's private `_set_num_threads` of its prefetch iterator",
    "prefetch_test.py::PrefetchIterDatasetTest::test_set_num_threads_increase_threads": "Grain's private `_set_num_threads` of its prefetch iterator",
    "prefetch_test.py::PrefetchIterDatasetTest::test_start_prefetch": "reads the private `_buffer` after Grain's start_prefetch",
    "prefetch_test.py::PrefetchIterDatasetTest::test_stats_are_initialized_in_a_single_thread": "overrides Grain's private `_initialize_stats`",
    "prefetch_test.py::PrefetchIterDatasetTest::test_invalid_checkpoint": "sets a state in Grain's raw format ({'next_index': n}); chute's states have their own sealed format",
    "prefetch_test.py::ThreadPrefetchIterDatasetTest::test_set_next_index_get_state": "mocks the get_state of Grain's private iterator class to count its calls",
    "prefetch_test.py::MultithreadPrefetchTest::test_mp_context_is_set_correctly": "Grain's private MultiprocessingContext handed to its iterators",
    "process_prefetch_test.py::ProcessPrefetchIterDatasetTest::test_worker_init_fn": "formats absl log lines with the prefix Grain's workers set (grain_logging.set_process_identifier_prefix)",
    "process_prefetch_test.py::MultiprocessingPrefetchTest::test_worker_init_fn": "formats absl log lines with the prefix Grain's workers set (grain_logging.set_process_identifier_prefix)",
    "process_prefetch_test.py::ProcessPrefetchIterDatasetTest::test_prefetch_traceback_preserves_worker_frames": "Grain's traceback filtering option (py_traceback_filtering)",
    "process_prefetch_test.py::ProcessPrefetchIterDatasetTest::test_parent_dataset_modifies_state": "compares with the private layout of Grain's process-prefetch state (iterations_to_skip, worker_state)",
}

# Applicable test methods that fail because chute deliberately differs from Grain
# (`docs/grain_differences.md` gives each difference and its reason).
KNOWN_DIFFERENCES: dict[str, str] = {
    "elastic_iterator_test.py::ElasticIteratorTest::test_filter_raises_error": (
        "chute's ElasticIterator takes a `filter` (its states stay exact, and "
        "merge_states reshards them: docs/elastic.md), where Grain's raises"
    ),
    "prefetch_test.py::PrefetchIterDatasetTest::test_dataset_and_iterator_types": (
        "iter(ds) gives chute's thread-guarded iterator (next from two threads at once "
        "raises), not the class of the stage's own iterator"
    ),
    "prefetch_test.py::PrefetchIterDatasetTest::test_filter_all_elements_raises": (
        "raises the ValueError, but the regex names the reader by its ReadOptions with "
        "Grain's defaults (num_threads=16, prefetch_buffer_size=500); chute's are AUTOTUNE "
        "(options_test.py's difference)"
    ),
    "shuffle_test.py::WindowShuffleInterDatasetTest::test_checkpoint_restore_on_fresh_iterator": (
        "reads the 'window_index' key of Grain's iterator state; chute's states have their "
        "own format (the elements after restoring match, which the test checks first)"
    ),
    "parquet_dataset_test.py::ParquetIterDatasetTest::test_sharded_files_and_interleaved_dataset": (
        "shuffle order: the window shuffle after the interleave permutes with chute's own "
        "generator (the interleave's order, checked first, matches)"
    ),
    "repeat_test.py::RepeatIterDatasetTest::test_repeat_after_mp_prefetch_does_not_restart_workers": (
        "counts the process ids computing elements: chute computes the first element in this "
        "process while its workers start (docs/grain_differences.md), so there is one more; "
        "the workers are not restarted"
    ),
    "process_prefetch_test.py::MultiprocessingPrefetchTest::test_set_state_does_not_restart_process": (
        "as repeat_test.py's: the first element is computed in this process while the "
        "workers start, one more process id"
    ),
    "data_loader_test.py::PyGrainDatasetIteratorTest::test_str": (
        "str(iter(loader)) shows Grain's DataLoader state (per-worker last_seen_indices); "
        "chute's states have their own format, the same for every worker count"
    ),
    "shuffle_test.py::ShuffleMapDatasetTest::test_cross_version_determinism": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs')",
    "samplers_test.py::IndexSamplerTest::test_shuffle_no_sharding": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs')",
    "samplers_test.py::IndexSamplerTest::test_shuffle_and_sharding_no_drop_remainder_single_epoch": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs')",
    "samplers_test.py::IndexSamplerTest::test_shuffle_and_sharding_no_drop_remainder_multi_epoch": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs')",
    "samplers_test.py::IndexSamplerTest::test_shuffle_and_sharding_drop_remainder_single_epoch": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs')",
    "samplers_test.py::IndexSamplerTest::test_shuffle_and_sharding_drop_remainder_multi_epoch": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs')",
    "packing_test.py::FirstFitPackIterDatasetTest::test_shuffle_seed_default": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs'); here the packer's shuffle of its bins",
    "packing_test.py::BestFitPackIterDatasetTest::test_shuffle_seed_default": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs'); here the packer's shuffle of its bins",
    "packing_test.py::FirstFitPackIterDatasetTest::test_pack_sequences_length_epoch_aware_shuffle_bins": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs'); here the packer's shuffle of its bins",
    "packing_test.py::BestFitPackIterDatasetTest::test_pack_sequences_length_epoch_aware_shuffle_bins": "shuffle order: chute permutes with its own keyed bijection (docs/grain_differences.md, 'The shuffle permutation differs'); here the packer's shuffle of its bins",
    "data_loader_test.py::DataLoaderTest_0::test_data_loader_checkpointing_same_object": "worker-count independence: Grain's workers each take a slice and their outputs interleave, so its output changes with the worker count; chute's does not (docs/grain_differences.md)",
    "data_loader_test.py::DataLoaderTest_1::test_data_loader_checkpointing_same_object": "worker-count independence: Grain's workers each take a slice and their outputs interleave, so its output changes with the worker count; chute's does not (docs/grain_differences.md)",
    "data_loader_test.py::DataLoaderTest_2::test_data_loader_checkpointing_same_object": "worker-count independence: Grain's workers each take a slice and their outputs interleave, so its output changes with the worker count; chute's does not (docs/grain_differences.md)",
    "data_loader_test.py::DataLoaderTest_0::test_data_loader_checkpointing_object_reconstruction": "worker-count independence: Grain's workers each take a slice and their outputs interleave, so its output changes with the worker count; chute's does not (docs/grain_differences.md)",
    "data_loader_test.py::DataLoaderTest_1::test_data_loader_checkpointing_object_reconstruction": "worker-count independence: Grain's workers each take a slice and their outputs interleave, so its output changes with the worker count; chute's does not (docs/grain_differences.md)",
    "data_loader_test.py::DataLoaderTest_2::test_data_loader_checkpointing_object_reconstruction": "worker-count independence: Grain's workers each take a slice and their outputs interleave, so its output changes with the worker count; chute's does not (docs/grain_differences.md)",
    "prefetch_test.py::MultithreadPrefetchTest::test_fails_with_iter_source_multiple_workers": "worker-count independence: a stream with no random-access part runs (in one thread, with multithread_prefetch), where Grain raises because it cannot deal it out; every pipeline runs, the same, with any thread or worker count (docs/grain_differences.md)",
    "process_prefetch_test.py::MultiprocessingPrefetchTest::test_fails_with_iter_source_multiple_workers": "worker-count independence: mp_prefetch over a stream with no random-access part runs in this process with a warning, where Grain raises; every pipeline runs, the same, with any worker count (docs/grain_differences.md)",
    "batch_test.py::BatchMapDatasetTest::test_batch_after_filter_raises_error": "MapDataset.batch after a filter gives smaller batches, where Grain raises (docs/grain_differences.md)",
    "batch_test.py::BatchMapDatasetTest::test_batch_after_flatmap_raises_error": "MapDataset.batch after a FlatMapMapDataset (which leaves positions empty, as a filter) gives smaller batches, where Grain raises",
    "options_test.py::ReadOptionsTest::test_defaults": "ReadOptions defaults to chute.AUTOTUNE, not 16 threads and 500 elements (docs/grain_differences.md)",
    "prefetch_test.py::PrefetchIterDatasetTest::test_filter_all_elements_warns": (
        "logs the warning, but the regex names the reader by its ReadOptions with Grain's "
        "defaults (num_threads=16, prefetch_buffer_size=500); chute's are AUTOTUNE "
        "(options_test.py's difference)"
    ),
}


# The files tests/grain_parity/test_grain_upstream.py runs (None: all the applicable ones).
SUITE_FILES: list[str] | None = None

# Applicable tests that tests/grain_parity/test_grain_upstream.py leaves out to keep its run short (this
# script's own run keeps them), with their time on a shared 2-core machine.
SLOW: dict[str, str] = {
    "process_prefetch_test.py::MultiprocessingPrefetchTest::test_fails_with_iter_source_multiple_"
    "workers": "a known difference (the stream runs in this process) that runs into the "
    "test timeout, 120 s",
    "prefetch_test.py::ThreadPrefetchIterDatasetTest::test_no_mem_leak": "a memory stress "
    "test: 1000 iterators of 8 MB arrays, about 30 s",
    "prefetch_test.py::ThreadPrefetchIterDatasetTest::test_no_mem_leak_with_double_prefetch": (
        "as test_no_mem_leak, with two prefetch stages: about 40 s each of its 2 cases"
    ),
}


@dataclasses.dataclass
class FileResult:
    file: str
    methods: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # key -> outcomes
    messages: dict[str, str] = dataclasses.field(default_factory=dict)  # key -> first error
    durations: dict[str, float] = dataclasses.field(default_factory=dict)  # test -> seconds
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


def prepare(workdir: Path, grain_dir: Path, leave_out: Iterable[str] = ()) -> Path:
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
    excluded = sorted({k for k in EXCLUDED if "::" in k} | set(leave_out))
    (workdir / "excluded.json").write_text(json.dumps(excluded))
    return tests


def run_file(workdir: Path, name: str, timeout: float, test_timeout: float = 120) -> FileResult:
    tests = workdir / "tests"
    results = workdir / f"{name}.jsonl"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(workdir / "site"), str(tests), str(HERE)]
        # Made absolute: pytest runs in the temporary directory, where `PYTHONPATH=src`
        # would name nothing and the installed chute would be tested instead.
        + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
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
        f"--timeout={test_timeout:g}",
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
        out.durations[r["nodeid"]] = r.get("seconds", 0.0)
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
    files: Sequence[str] | None = None,
    jobs: int = 1,
    timeout: float = 900,
    leave_out: Iterable[str] = (),
    test_timeout: float = 120,
) -> list[FileResult]:
    """Runs Grain's applicable test files (or `files`), leaving out the test methods in
    `leave_out` (e.g. `SLOW`) besides `EXCLUDED`."""
    grain_dir = grain_package_dir()
    with tempfile.TemporaryDirectory(prefix="chute-grain-tests-") as tmp:
        workdir = Path(tmp)
        prepare(workdir, grain_dir, leave_out)
        names = [p.name for p in test_files(grain_dir) if not _is_excluded_file(p.name)]
        if files:
            unknown = sorted(set(files) - {p.name for p in test_files(grain_dir)})
            if unknown:
                raise ValueError(f"not among Grain's test files: {unknown}")
            names = [n for n in names if n in files]
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(lambda n: run_file(workdir, n, timeout, test_timeout), names))


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
    ran = {k: r.method_outcome(k) for r in results for k in r.methods}
    stale = sorted(k for k in KNOWN_DIFFERENCES if ran.get(k) == "passed")
    if stale:
        lines.append(
            "known differences that pass now (take them off the list): " + ", ".join(stale)
        )
    slowest = sorted(
        ((sec, test) for r in results for test, sec in r.durations.items()), reverse=True
    )[:8]
    lines.append("slowest tests: " + ", ".join(f"{t} {s:.1f} s" for s, t in slowest))
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
    parser.add_argument(
        "--quick", action="store_true", help="leave out the slow tests in SLOW, as the CI test does"
    )
    parser.add_argument(
        "--test-timeout", type=float, default=120, help="seconds a test may take (120)"
    )
    args = parser.parse_args(argv)
    results = run(
        args.files,
        jobs=args.jobs,
        leave_out=SLOW if args.quick else (),
        test_timeout=args.test_timeout,
    )
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
