"""The public namespace, and seed code run with `import chute as grain`."""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import chute as grain
import chute.python  # `grain.python` below: a subpackage, there once imported

PUBLIC_MODULES = [
    "chute",
    "chute.checkpoint",
    "chute.constants",
    "chute.python",
    "chute.transforms",
    "chute.samplers",
    "chute.sharding",
    "chute.sources",
    "chute.testing",
    "chute.experimental",
    "chute.multiprocessing",
    "chute.records",
    "chute.torch",
    "chute.beam",
    "chute.metrics",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_exports_resolve_and_are_listed(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__ == sorted(module.__all__)
    for attr in module.__all__:
        assert getattr(module, attr) is not None, attr
    public = {a for a in vars(module) if not a.startswith("_")}
    submodules = {a for a in public if type(getattr(module, a)).__name__ == "module"}
    assert public - submodules - set(module.__all__) <= {"annotations"}, public - set(
        module.__all__
    )


def test_one_table_of_public_names_and_type_checkers_see_the_same() -> None:
    """`chute/__init__.py` names each public name once, in `_PUBLIC` (name -> the module
    that defines it, "chute" for a public submodule), which `__all__` and the lazy
    `__getattr__` read; its imports under TYPE_CHECKING (for type checkers) must say the
    same, name for name and module for module."""
    tree = ast.parse(Path(grain.__file__).read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_typing.TYPE_CHECKING"
    )
    typed: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module, ast.unparse(node)
        for alias in node.names:
            assert alias.asname == alias.name, ast.unparse(node)
            assert alias.name not in typed, f"{alias.name} imported twice"
            typed[alias.name] = node.module
    assert typed == grain._PUBLIC
    assert vars(grain)["__all__"] == sorted(grain._PUBLIC)  # the interpreter's only
    for name, module in grain._PUBLIC.items():
        home = importlib.import_module(f"chute.{name}" if module == "chute" else module)
        assert getattr(grain, name) is (home if module == "chute" else vars(home)[name]), name


@pytest.mark.slow  # mypy: > 7 s on 2 cores, in .ci/run (as tests/project/test_typing.py)
def test_a_star_import_gives_type_checkers_every_public_name(tmp_path: Path) -> None:
    """`chute.__all__` is built from the table when the module runs; type checkers, which
    do not run it, take the names a star import gives from the imports under
    TYPE_CHECKING (a computed `__all__` would give them none)."""
    names = sorted(grain._PUBLIC)
    star = tmp_path / "star.py"
    star.write_text(
        "from typing import assert_type\n\nfrom chute import *\n\n"
        + "".join(f"print({name})\n" for name in names)
        + "assert_type(MapDataset.range(3), MapDataset[int])\n"
    )
    src = Path(grain.__file__).resolve().parents[1]
    env = dict(os.environ)
    if src.name not in ("site-packages", "dist-packages"):
        env["MYPYPATH"] = str(src)
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--config-file=", "--cache-dir=/dev/null"),
            *("--follow-imports=silent", "--no-pretty", str(star)),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_multiprocessing_options_has_one_home_and_grains_alias() -> None:
    homes = [
        name
        for name in PUBLIC_MODULES
        if "MultiprocessingOptions" in importlib.import_module(name).__all__
    ]
    assert homes == ["chute", "chute.python", "chute.multiprocessing"]  # Grain's three
    assert grain.multiprocessing.MultiprocessingOptions is grain.MultiprocessingOptions
    assert grain.python.MultiprocessingOptions is grain.MultiprocessingOptions
    assert not hasattr(grain.experimental, "MultiprocessingOptions")


def test_seed_000_names() -> None:
    for name in [
        "DataLoader",
        "IndexSampler",
        "TypeConversion",
        "Batch",
        "RandomMapTransform",
        "MapTransform",
        "ReadOptions",
        "MapDataset",
        "IterDataset",
        "DatasetIterator",
    ]:
        assert hasattr(grain, name)
    assert grain.transforms.Map is grain.MapTransform
    assert grain.transforms.RandomMap is grain.RandomMapTransform
    assert callable(grain.sharding.shard_by_jax_process)


def test_seed_001_walkthrough(corpus_records: list[bytes]) -> None:
    data_source = corpus_records
    dataset: grain.MapDataset[Any] = grain.MapDataset.source(data_source)

    def parse_and_transform(record: bytes) -> dict[str, object]:
        return {"record": json.loads(record)["label"]}

    batch_size = 32
    dataset = (
        dataset.shuffle(seed=42)
        .map(parse_and_transform)
        .batch(batch_size=batch_size, drop_remainder=True)
    )
    data_iterator = iter(dataset)
    first = next(data_iterator)
    assert first["record"].shape == (32,)
    state = data_iterator.get_state()
    after = next(data_iterator)
    data_iterator.set_state(state)
    assert np.array_equal(next(data_iterator)["record"], after["record"])


def test_seed_003_pipeline_up_to_batching(
    corpus_records: list[bytes], tokenizer_path: Path
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    source = corpus_records
    parsed_ds = grain.MapDataset.source(source).map(json.loads)
    assert set(parsed_ds[0]) == {"title", "description", "label"}

    def tokenize(element: dict[str, str]) -> dict[str, np.ndarray]:
        return {"description": np.asarray(tokenizer.encode(element["description"]).ids)}

    tokenized_ds = parsed_ds.map(tokenize)
    assert tokenized_ds[0]["description"][0] == 101  # [CLS]
    shuffled_ds = tokenized_ds.shuffle(seed=42)
    repeated_ds = shuffled_ds.repeat(num_epochs=100)
    shard_index, shard_count = 1, 16
    sharded_ds = repeated_ds[shard_index::shard_count]
    assert len(sharded_ds) == len(source) * 100 // 16
    sequence_length = 128

    def trim_and_pad(element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tokens = element["description"][:sequence_length]
        return {"description": np.pad(tokens, (0, sequence_length - len(tokens)))}

    ds = sharded_ds.map(trim_and_pad).to_iter_dataset(grain.ReadOptions(num_threads=0))
    batched_ds = ds.batch(64, drop_remainder=True)
    batch = next(iter(batched_ds))
    assert (
        batch["description"].shape == (64, 128)
        and batch["description"][:, 0].tolist() == [101] * 64
    )


def test_tokenizer_reproduces_the_seed_ids(tokenizer_path: Path) -> None:
    from tokenizers import Tokenizer

    ids = (
        Tokenizer.from_file(str(tokenizer_path))
        .encode(
            "AMD #39;s new dual-core Opteron chip is designed mainly for corporate computing "
            "applications, including databases, Web services, and financial transactions."
        )
        .ids
    )
    assert ids[:5] == [101, 2572, 2094, 1001, 4464]


def shared_data_dir() -> Path:
    """As conftest finds it: $CHUTE_SHARED_DATA, else `shared/data` beside the checkout."""
    env = os.environ.get("CHUTE_SHARED_DATA")
    if env:
        return Path(env)
    for parent in Path(__file__).resolve().parents[2].parents:
        if (parent / "shared" / "data").is_dir():
            return parent / "shared" / "data"
    raise RuntimeError("shared/data not found beside the checkout: set CHUTE_SHARED_DATA")


def _demo_outside_the_checkout(tmp_path: Path) -> Path:
    """A copy of the demo where no `shared/` directory is beside it."""
    demo = tmp_path / "demo.py"
    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "demo.py", demo)
    return demo


def test_demo_runs_and_resumes(tmp_path: Path) -> None:
    try:
        shared = shared_data_dir()
    except RuntimeError as e:
        pytest.skip(str(e))
    demo = _demo_outside_the_checkout(tmp_path)
    out = subprocess.run(
        [
            sys.executable,
            str(demo),
            "--records",
            "1500",
            "--batches",
            "10",
            "--data-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, "CHUTE_SHARED_DATA": str(shared), "PYTHONPATH": _pythonpath()},
    ).stdout
    assert "examples/s" in out and "next 20 batches identical" in out


def test_demo_without_shared_data_says_how_to_point_at_it(tmp_path: Path) -> None:
    demo = _demo_outside_the_checkout(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "CHUTE_SHARED_DATA"}
    done = subprocess.run(
        [sys.executable, str(demo), "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "PYTHONPATH": _pythonpath()},
    )
    assert done.returncode != 0 and "set CHUTE_SHARED_DATA" in done.stderr
    wrong = {**env, "PYTHONPATH": _pythonpath(), "CHUTE_SHARED_DATA": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(demo), "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=wrong,
    )
    assert (
        done.returncode != 0 and f"CHUTE_SHARED_DATA={tmp_path} has no make_corpus" in done.stderr
    )


def _pythonpath() -> str:
    """chute's import path, for a script run from outside the checkout."""
    src = str(Path(grain.__file__).resolve().parents[1])
    return os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH", "")]))
