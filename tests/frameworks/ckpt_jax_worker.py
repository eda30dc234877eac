"""One process of the 2-process `jax.distributed` checkpoint test (test_checkpoint_orbax.py).

`python ckpt_jax_worker.py PHASE PROCESS_ID PORT CKPT_DIR OUT`:
- `train`: trains SAVE_AT steps on this process's shard, saves model and data iterator with
  an Orbax CheckpointManager, trains on (work that will be lost) and dies with os._exit.
- `resume`: restores the latest step and writes the restored model and the rest of its
  stream to OUT (JSON).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

import chute

SAVE_AT = 3
NUM_PROCESSES = 2


def pipeline(shard_index: int, shard_count: int) -> chute.IterDataset[Any]:
    """Each process reads its own shard: a shuffled range, mapped and batched."""
    return (
        chute.MapDataset.range(40)
        .shuffle(seed=7)[shard_index::shard_count]
        .map(lambda x: x * 10)
        .batch(3)
        .to_iter_dataset()
    )


def train_step(w: Any, batch: np.ndarray) -> Any:
    """Data-parallel: the processes' batch sums are gathered, so `w` stays the same in all."""
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    local = jnp.asarray(batch, jnp.float32).sum()
    return w + 0.01 * jnp.sum(multihost_utils.process_allgather(local))


def main(phase: str, process_id: int, port: int, ckpt_dir: str, out: str) -> None:
    import jax

    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=NUM_PROCESSES,
        process_id=process_id,
    )
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    index, count = jax.process_index(), jax.process_count()
    it = iter(pipeline(index, count))
    params = {"w": np.zeros((), np.float32)}
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    with ocp.CheckpointManager(ckpt_dir, options=options) as mngr:
        if phase == "train":
            w = jnp.zeros(())
            for _ in range(SAVE_AT):
                w = train_step(w, next(it))
            params = {"w": np.asarray(w)}
            mngr.save(
                SAVE_AT,
                args=ocp.args.Composite(
                    model=ocp.args.StandardSave(params),
                    data=chute.checkpoint.CheckpointSave(it),
                ),
            )
            mngr.wait_until_finished()
            for _ in range(2):  # trained on, never saved: lost when the process dies
                w = train_step(w, next(it))
            sys.stdout.flush()
            os._exit(0)
        restored = mngr.restore(
            mngr.latest_step(),
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(params),
                data=chute.checkpoint.CheckpointRestore(it),
            ),
        )
    result = {
        "process": [index, count],
        "step": SAVE_AT,
        "w": float(restored["model"]["w"]),
        "rest": [b.tolist() for b in it],
    }
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
