"""torch's side: `state_dict`/`load_state_dict` through torch.distributed.checkpoint (2 gloo
ranks) and torchdata's StatefulDataLoader. torch is never a dependency of chute."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import chute

sys.path.insert(0, str(Path(__file__).parent))
import ckpt_torch_worker as worker

from process_helpers import wait_all

torch = pytest.importorskip("torch", reason="torch not installed: the torch tests need it")
dcp = pytest.importorskip("torch.distributed.checkpoint", reason="torch without distributed")


def test_an_iterator_is_torch_stateful() -> None:
    from torch.distributed.checkpoint.stateful import Stateful

    assert isinstance(iter(chute.MapDataset.range(3).to_iter_dataset()), Stateful)


def test_dcp_round_trips_a_state_with_lists_and_strings(tmp_path: Path) -> None:
    ds = worker.pipeline(0, 1)  # mix: "parents" is a list of states with fingerprints
    it = iter(ds)
    for _ in range(4):
        next(it)
    dcp.save({"data": it}, checkpoint_id=str(tmp_path))
    expected = [b.tolist() for b in it]
    fresh = iter(ds)
    dcp.load({"data": fresh}, checkpoint_id=str(tmp_path))
    assert [b.tolist() for b in fresh] == expected


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(phase: str, ckpt: Path, tmp_path: Path) -> list[dict[str, Any]]:
    port = _free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    outs = [tmp_path / f"{phase}{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker.__file__), phase, str(i), str(port), str(ckpt), str(o)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i, o in enumerate(outs)
    ]
    wait_all(procs)
    return [json.loads(o.read_text()) for o in outs if o.exists()]


@pytest.mark.slow
def test_two_gloo_ranks_save_die_load_and_continue_their_own_streams(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    start = time.perf_counter()
    assert _run_ranks("train", ckpt, tmp_path) == []  # both died after saving
    results = _run_ranks("resume", ckpt, tmp_path)
    print(f"2-rank gloo dcp save/kill/load: {time.perf_counter() - start:.1f} s")

    streams = [[b.tolist() for b in worker.pipeline(r, 2)] for r in range(2)]
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["rest"] == streams[r["rank"]][worker.SAVE_AT :]
    assert results[0]["rest"] != results[1]["rest"]
    # One key for all ranks keeps one rank's state (dcp takes a non-tensor value as
    # replicated); chute rejects it on the other rank (another shard has another
    # fingerprint), which is why each rank saves under its own key.
    shared = [r["shared"] for r in results]
    assert shared.count("restored") == 1, shared
    assert any("in the state, but this pipeline has" in s for s in shared), shared
