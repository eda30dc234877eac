"""Shared fixtures: the real corpus and tokenizer from ../shared/data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """`shared/data` beside the checkout (override with CHUTE_SHARED_DATA)."""
    env = os.environ.get("CHUTE_SHARED_DATA")
    if env:
        return Path(env)
    for parent in REPO.parents:
        candidate = parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    raise RuntimeError(
        "shared/data not found beside the checkout: set CHUTE_SHARED_DATA to its path"
    )


def shared_data_or_skip_now() -> Path:
    """`shared/data` with the tokenizer and the corpus script, or the test is skipped with
    the reason (a checkout on its own)."""
    try:
        path = shared_data_dir()
    except RuntimeError as e:
        pytest.skip(f"needs the real corpus and tokenizer: {e}")
    for name in ("bert-base-uncased.tokenizer.json", "make_corpus.py"):
        if not (path / name).is_file():
            pytest.skip(f"{path / name} not found (CHUTE_SHARED_DATA or shared/data)")
    return path


@pytest.fixture(scope="session")
def shared_data_or_skip() -> Path:
    """The fixture of `shared_data_or_skip_now()`."""
    return shared_data_or_skip_now()


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3,000-record corpus made by shared/data/make_corpus.py (real English prose)."""
    out = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    subprocess.run(
        [sys.executable, str(shared_data_or_skip_now() / "make_corpus.py"), str(out), "3000"],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="session")
def corpus_records(corpus_path: Path) -> list[bytes]:
    return corpus_path.read_bytes().splitlines()


@pytest.fixture(scope="session")
def tokenizer_path() -> Path:
    return shared_data_or_skip_now() / "bert-base-uncased.tokenizer.json"


def loads(record: bytes) -> dict[str, object]:
    return json.loads(record)


@pytest.fixture
def debug_mode() -> Iterator[None]:
    """chute's debug mode on for one test (summaries printed only at the end)."""
    import chute

    chute.config.update("py_debug_mode", True)
    chute.config.update("py_debug_summary_interval_s", 3600.0)
    try:
        yield
    finally:
        chute.config.update("py_debug_mode", False)
        chute.config.update("py_debug_summary_interval_s", 60.0)
