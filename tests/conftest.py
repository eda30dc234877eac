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

# The tests live in folders that mirror src/chute/_src (core, ops, exec, storage, debug,
# frameworks), plus grain_parity and project; the helpers they share (process_helpers,
# mp_helpers, mp_pipelines, ...) live here, importable from every folder and, through
# sys.path, by the worker processes the tests start.
TESTS = str(Path(__file__).resolve().parent)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


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


class S3Server:
    """A real S3-compatible server (moto) on 127.0.0.1, and the storage options for it."""

    def __init__(self, endpoint: str, port: int) -> None:
        self.endpoint = endpoint
        self.port = port
        # Credentials in the options, not only the environment: they travel with a source
        # to worker processes, whose environment is the forkserver's (started earlier).
        self.options: dict[str, object] = {
            "client_kwargs": {"endpoint_url": endpoint},
            "key": "testing",
            "secret": "testing",
        }

    def fs(self) -> object:
        import s3fs

        return s3fs.S3FileSystem(**self.options)

    def bucket(self, name: str) -> str:
        """A new empty bucket; its URL prefix (`s3://name`)."""
        fs = self.fs()
        fs.mkdir(name)  # type: ignore[attr-defined]
        return f"s3://{name}"


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 (a free port) for the session, dummy credentials in
    the environment; skipped with the reason when moto[server] or s3fs is missing."""
    try:
        import s3fs  # noqa: F401
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        pytest.skip(f"needs moto[server] and s3fs (the test extra): {e}")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ.setdefault(key, value)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}", port)
    finally:
        server.stop()


# Grain's documented examples (tests/grain_parity/grain_examples/) run top to bottom when
# imported, as a notebook's cells do; tests/grain_parity/test_grain_examples.py runs each in
# its own interpreter, so the doctest collector must not import them.
collect_ignore = ["grain_parity/grain_examples"]
