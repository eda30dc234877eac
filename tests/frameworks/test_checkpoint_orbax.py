"""chute's Orbax handler: the iterator saved beside the model, one file per process."""

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
import ckpt_jax_worker as worker

from process_helpers import wait_all

ocp = pytest.importorskip(
    "orbax.checkpoint",
    reason="orbax-checkpoint (and jax) not installed: pip install 'chute[orbax]'",
)

WORKER = Path(worker.__file__)


def test_handler_names_the_missing_file_and_the_process_count(tmp_path: Path) -> None:
    it = iter(chute.MapDataset.range(5).to_iter_dataset())
    handler = chute.checkpoint.CheckpointHandler()
    handler.save(tmp_path, args=chute.checkpoint.CheckpointSave(it))
    assert os.listdir(tmp_path) == ["process_0-of-1.json"]
    os.rename(tmp_path / "process_0-of-1.json", tmp_path / "process_0-of-4.json")
    with pytest.raises(chute.CheckpointError, match=r"saved by 4 processes, and this run has 1"):
        handler.restore(tmp_path, args=chute.checkpoint.CheckpointRestore(it))


def test_handler_restores_an_elastic_iterator_with_another_process_count(
    tmp_path: Path,
) -> None:
    from chute._src.core.checkpointing import encode

    ds = chute.MapDataset.range(60).shuffle(seed=3).filter(lambda x: x % 4 != 1)
    opts = chute.sharding.ShardOptions

    def host(j: int, m: int) -> Any:
        return iter(chute.experimental.ElasticIterator(ds, 6, opts(j, m)))

    # Two hosts run 2 steps; each writes its file as its handler.save would (process j of 2).
    seen: list[int] = []
    for j in range(2):
        it = host(j, 2)
        for _ in range(2):
            seen += next(it).tolist()
        (tmp_path / f"process_{j}-of-2.json").write_text(encode(it.get_state()))
    # One process (this one: process 0 of 1) restores through the handler and reads the rest.
    it = chute.checkpoint.CheckpointHandler().restore(
        tmp_path, args=chute.checkpoint.CheckpointRestore(host(0, 1))
    )
    rest = [x for batch in it for x in batch.tolist()]
    kept = [x for x in range(60) if x % 4 != 1]
    assert not set(seen) & set(rest)  # nothing delivered twice
    assert len(seen) + len(rest) == len(seen + rest) <= len(kept)
    assert set(seen) | set(rest) <= set(kept)
    assert len(kept) - len(seen) - len(rest) < 6  # only the last partial batch is dropped


def test_grain_names_under_import_chute_as_grain() -> None:
    import chute as grain

    assert grain.checkpoint.CheckpointSave.__mro__[1] is ocp.args.CheckpointArgs
    assert ocp.args.get_registered_handler_cls(grain.checkpoint.CheckpointRestore) is (
        grain.checkpoint.CheckpointHandler
    )


def test_grain_python_names_of_the_orbax_arguments(tmp_path: Path) -> None:
    """`grain.python` names the arguments PyGrainCheckpoint{Save,Restore}; Grain's DataLoader
    tutorial calls them GrainCheckpoint{Save,Restore}. Both save and restore a loader."""
    import chute.python as pygrain

    assert (
        pygrain.GrainCheckpointSave
        is pygrain.PyGrainCheckpointSave
        is chute.checkpoint.CheckpointSave
    )
    assert pygrain.GrainCheckpointRestore is pygrain.PyGrainCheckpointRestore
    loader = pygrain.DataLoader(
        data_source=list(range(10)),
        sampler=pygrain.IndexSampler(10, shuffle=True, seed=1, num_epochs=1),
    )
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    mngr = ocp.CheckpointManager(tmp_path / "ckpt")
    assert mngr.save(3, args=pygrain.GrainCheckpointSave(it), force=True)
    mngr.wait_until_finished()
    rest = list(it)
    mngr.restore(3, args=pygrain.GrainCheckpointRestore(it))
    assert list(it) == rest and sorted(head + rest) == list(range(10))
    mngr.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_processes(phase: str, ckpt: Path, tmp_path: Path) -> list[dict[str, Any]]:
    port = _free_port()
    env = {
        "JAX_PLATFORMS": "cpu",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    outs = [tmp_path / f"{phase}{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), phase, str(i), str(port), str(ckpt), str(outs[i])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    wait_all(procs)
    return [json.loads(o.read_text()) for o in outs if o.exists()]


@pytest.mark.slow
def test_two_jax_processes_save_die_restore_and_continue_their_own_streams(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    start = time.perf_counter()
    assert _run_processes("train", ckpt, tmp_path) == []  # both died after saving
    step_dir = ckpt / str(worker.SAVE_AT)
    assert sorted(os.listdir(step_dir / "data")) == [
        "commit_success.txt",
        "process_0-of-2.json",
        "process_1-of-2.json",
    ]
    results = _run_processes("resume", ckpt, tmp_path)
    print(f"2-process jax.distributed save/kill/restore: {time.perf_counter() - start:.1f} s")

    # The uninterrupted run of each shard, and the model it trained up to the save.
    streams = [[b.tolist() for b in worker.pipeline(i, 2)] for i in range(2)]
    w = 0.01 * sum(sum(sum(b) for b in s[: worker.SAVE_AT]) for s in streams)
    assert [r["process"] for r in results] == [[0, 2], [1, 2]]
    for i, r in enumerate(results):
        assert r["rest"] == streams[i][worker.SAVE_AT :], i
        assert r["w"] == pytest.approx(w)
    assert results[0]["rest"] != results[1]["rest"]
