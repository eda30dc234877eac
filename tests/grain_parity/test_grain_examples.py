"""Grain's own documented examples, copied into tests/grain_parity/grain_examples/, run with chute.

Each file there is the code of one of Grain's documents (the README's example, the
tutorials for the Dataset API, the DataLoader, data sources, checkpointing), as Grain
users find it, with `import grain` read as `import chute as grain`; its header names the
source, the license and every edit. Each runs top to bottom in a fresh interpreter, the way
a notebook runs its cells (in `__main__`, with no file of its own for worker processes to
import again): once with chute, from this checkout's `src`, and once with the imports
switched back to the real grain 0.2.18 (skipped, with the reason, when grain or absl is
missing), which shows the copy is faithful. Where an example prints the same thing
whichever library runs it, chute's output must equal Grain's.
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import shared_data_or_skip_now
from grain_helpers import base_env, grain_missing, imported_modules, run_python, to_grain

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
EXAMPLES = {path.stem: path for path in sorted((HERE / "grain_examples").glob("*.py"))}

# The documents copied, one file each.
DOCUMENTS = {
    "readme_quickstart": "README.md",
    "dataset_basic_tutorial": "docs/tutorials/dataset_basic_tutorial.md",
    "dataset_advanced_tutorial": "docs/tutorials/dataset_advanced_tutorial.md",
    "data_loader_tutorial": "docs/tutorials/data_loader_tutorial.md",
    "arrayrecord_data_source_tutorial": (
        "docs/tutorials/data_sources/arrayrecord_data_source_tutorial.md"
    ),
    "parquet_dataset_tutorial": "docs/tutorials/data_sources/parquet_dataset_tutorial.md",
    "load_from_s3_tutorial": "docs/tutorials/data_sources/load_from_s3_tutorial.md",
    "jax_training_tutorial": "docs/tutorials/jax_training_tutorial.md",
}

# Examples whose printed output does not depend on which library runs them, compared line
# for line. The others print shuffled elements, and chute's shuffle is its own permutation
# (docs/grain_differences.md, "The shuffle permutation differs").
SAME_OUTPUT = {"readme_quickstart", "parquet_dataset_tutorial"}

# Examples that fail for a known reason, kept strict so that a fix is noticed.
CHUTE_XFAIL: dict[str, str] = {}
GRAIN_XFAIL: dict[str, str] = {
    "data_loader_tutorial": (
        "AttributeError: grain 0.2.18's grain.python has no GrainCheckpointSave, the name the "
        "tutorial saves the iterator with (grain's is PyGrainCheckpointSave; chute has both)"
    ),
}

# A notebook runs its cells in `__main__`, which has no file: worker processes started by
# spawn or forkserver do not import it again, and what they need of it travels pickled.
# The runner does the same with the example's code. Grain's worker processes also read absl
# flags, which a notebook's kernel has parsed; the Grain runner marks them parsed.
_NOTEBOOK = "exec(compile(pathlib.Path(sys.argv[1]).read_text(), sys.argv[1], 'exec'))\n"
_CHUTE_BOOT = "import pathlib, sys\n" + _NOTEBOOK
_GRAIN_BOOT = (
    "import pathlib, sys\nfrom absl import flags\nflags.FLAGS.mark_as_parsed()\n" + _NOTEBOOK
)


def _env(source: str) -> dict[str, str]:
    """The run's environment; the example's third-party imports must be installed, and
    examples that read the real tokenizer get `CHUTE_SHARED_DATA`."""
    for module in sorted(set(imported_modules(source)) - {"chute", "grain"}):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"the example imports {module}, which is not installed")
    env = base_env()
    env["MPLBACKEND"] = "Agg"  # matplotlib draws to memory: plt.show() returns at once
    if "CHUTE_SHARED_DATA" in source:
        env["CHUTE_SHARED_DATA"] = str(shared_data_or_skip_now())
    return env


def _run(source: str, boot: str, env: dict[str, str]) -> str:
    """Runs the example's code as a notebook would, in a fresh directory; its stdout."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "example.py"
        script.write_text(source)
        work = Path(tmp) / "work"
        work.mkdir()
        return run_python(["-c", boot, str(script)], env, work).stdout


class Runs:
    """Every example's runs, started together at the module's start (a few at a time: most
    of a run is starting processes and waiting on them), each test waiting for its own."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=3)
        self._runs: dict[tuple[str, str], Future[str]] = {}

    def start(self, name: str, library: str) -> Future[str]:
        """The run of example `name` with `library` ("chute" or "grain"); skips the test
        (without starting anything) when the run cannot happen here."""
        if (name, library) not in self._runs:
            source = EXAMPLES[name].read_text()
            if library == "chute":
                env = _env(source)
                env["PYTHONPATH"] = str(SRC)
                run = self._pool.submit(_run, source, _CHUTE_BOOT, env)
            else:
                reason = grain_missing()
                if reason is not None:
                    pytest.skip(reason)
                source = to_grain(source)
                assert "chute" not in imported_modules(source)
                run = self._pool.submit(_run, source, _GRAIN_BOOT, _env(source))
            self._runs[name, library] = run
        return self._runs[name, library]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    runs = Runs()
    for name in EXAMPLES:
        for library in ("chute", "grain"):
            try:
                runs.start(name, library)
            except pytest.skip.Exception:
                pass  # the test itself skips, with the reason
    yield runs
    runs.close()


def _params(xfail: dict[str, str]) -> list:
    return [
        pytest.param(
            name,
            id=name,
            marks=[pytest.mark.xfail(strict=True, reason=xfail[name])] if name in xfail else [],
        )
        for name in EXAMPLES
    ]


def test_every_document_is_copied() -> None:
    assert set(EXAMPLES) == set(DOCUMENTS)


@pytest.mark.parametrize("name", EXAMPLES)
def test_header_names_source_license_and_edits(name: str) -> None:
    source = EXAMPLES[name].read_text()
    header = source[: source.index("# fmt: off")]
    url = re.search(r"https://github\.com/google/grain/blob/[0-9a-f]{40}/(\S+)", header)
    assert url is not None and url.group(1) == DOCUMENTS[name], header
    assert 'Licensed under the Apache License, Version 2.0 (the "License")' in header
    assert "# Edits, and only these:" in header
    assert re.search(r"^import chute(\.python)? as grain$", source, re.M), name


@pytest.mark.parametrize("name", _params(CHUTE_XFAIL))
def test_example_runs_with_chute(name: str, runs: Runs) -> None:
    runs.start(name, "chute").result()


@pytest.mark.parametrize("name", _params(GRAIN_XFAIL))
def test_example_runs_with_grain(name: str, runs: Runs) -> None:
    grain_out = runs.start(name, "grain").result()
    if name in SAME_OUTPUT:
        assert runs.start(name, "chute").result().splitlines() == grain_out.splitlines()


def test_runner_is_a_notebook(tmp_path: Path) -> None:
    """The example's code runs in `__main__` with no file, as a notebook's cells do."""
    script = tmp_path / "probe.py"
    script.write_text("import __main__\nprint(__name__, hasattr(__main__, '__file__'))\n")
    out = run_python(["-c", _CHUTE_BOOT, str(script)], base_env(), tmp_path).stdout
    assert out == "__main__ False\n"
