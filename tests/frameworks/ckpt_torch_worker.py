"""One rank of the 2-rank gloo `torch.distributed.checkpoint` test (test_checkpoint_torch.py).

`python ckpt_torch_worker.py PHASE RANK PORT CKPT_DIR OUT`:
- `train`: reads SAVE_AT batches of this rank's shard, saves the iterator with
  `dcp.save({f"data_rank{rank}": it, "shared": it})`, reads on (lost) and dies with
  os._exit.
- `resume`: `dcp.load`s a fresh iterator from `data_rank{rank}` and writes the rest of its
  stream to OUT (JSON), with what loading the `shared` key gave (dcp keeps one copy of a
  non-tensor value saved by every rank under one key: one rank's).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import chute

SAVE_AT = 3
WORLD_SIZE = 2


def pipeline(rank: int, world_size: int) -> chute.IterDataset[Any]:
    """Each rank reads its own shard, mixed from two sources (a state with a list)."""
    evens = chute.MapDataset.range(0, 60, 2).shuffle(seed=3)[rank::world_size]
    odds = chute.MapDataset.range(1, 60, 2).shuffle(seed=4)[rank::world_size]
    return chute.IterDataset.mix(
        [evens.to_iter_dataset(), odds.to_iter_dataset()], weights=[0.5, 0.5]
    ).batch(2)


def main(phase: str, rank: int, port: int, ckpt_dir: str, out: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    it = iter(pipeline(rank, WORLD_SIZE))
    key = f"data_rank{rank}"
    if phase == "train":
        for _ in range(SAVE_AT):
            next(it)
        dcp.save({key: it, "shared": it}, checkpoint_id=ckpt_dir)
        for _ in range(2):  # read on, never saved: lost when the process dies
            next(it)
        dist.barrier()
        sys.stdout.flush()
        os._exit(0)
    shared = iter(pipeline(rank, WORLD_SIZE))
    try:
        dcp.load({"shared": shared}, checkpoint_id=ckpt_dir)
        shared_result = "restored"
    except chute.CheckpointError as e:
        shared_result = str(e)
    dcp.load({key: it}, checkpoint_id=ckpt_dir)
    with open(out, "w") as f:
        json.dump({"rank": rank, "rest": [b.tolist() for b in it], "shared": shared_result}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
