"""Python's own file server (`python -m http.server`, a real process on 127.0.0.1 on a
free port) answers every GET with `200` and the whole file: JSONL and `.crec` files it
serves read right, streamed and at random, with 0 and 2 worker processes, the same
elements in the same order as the local files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import chute
from chute import sources
from chute.records import RecordWriter

pytest.importorskip("obstore", reason="needs obstore (the remote extra)")

LINES = 20_000  # 1.4 MB: more than a stream's first read, so it reads a plain GET
RECORDS = 30_000


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base URL, folder) of `python -m http.server` serving the folder."""
    root = tmp_path_factory.mktemp("www")
    with open(root / "d.jsonl", "w") as f:
        for i in range(LINES):
            f.write(json.dumps({"i": i, "text": f"line {i} " + "z" * (i % 50)}) + "\n")
    with RecordWriter(root / "d.crec") as w:
        for i in range(RECORDS):
            w.write(b"record %d " % i + b"r" * (i % 40))
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1"],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 40123 (...) ..."
        port = re.search(r"port (\d+)", line)
        assert port is not None, line
        yield f"http://127.0.0.1:{port.group(1)}", root
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from remote_helpers import use_remote_env

    use_remote_env(monkeypatch, tmp_path)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def _workers(ds: chute.IterDataset[Any], workers: int) -> chute.IterDataset[Any]:
    if not workers:
        return ds
    return ds.mp_prefetch(chute.MultiprocessingOptions(num_workers=workers))


def _ids(x: dict[str, Any]) -> int:
    return int(x["i"])


@pytest.mark.parametrize("workers", [0, 2])
def test_jsonl_streamed_and_at_random(served: tuple[str, Path], workers: int) -> None:
    base, root = served
    url = f"{base}/d.jsonl"
    streamed = _workers(chute.experimental.JsonlIterDataset([url]).map(_ids), workers)
    assert list(streamed) == list(range(LINES))

    def shuffled(path: str) -> chute.IterDataset[Any]:
        src = sources.JsonlDataSource(path)
        return chute.MapDataset.source(src).shuffle(seed=3).map(_ids).to_iter_dataset()

    local = list(shuffled(str(root / "d.jsonl")))
    assert sorted(local) == list(range(LINES)) and local != list(range(LINES))
    assert list(_workers(shuffled(url), workers)) == local


@pytest.mark.parametrize("workers", [0, 2])
def test_crec_streamed_and_at_random(served: tuple[str, Path], workers: int) -> None:
    base, root = served
    url = f"{base}/d.crec"

    def pipeline(path: str, seed: int | None) -> chute.IterDataset[Any]:
        ds = chute.MapDataset.source(sources.RecordFileDataSource(path))
        return (ds if seed is None else ds.shuffle(seed=seed)).to_iter_dataset()

    want = [b"record %d " % i + b"r" * (i % 40) for i in range(RECORDS)]
    assert list(_workers(pipeline(url, None), workers)) == want
    local = list(pipeline(str(root / "d.crec"), 5))
    assert sorted(local) == sorted(want) and local != want
    assert list(_workers(pipeline(url, 5), workers)) == local
