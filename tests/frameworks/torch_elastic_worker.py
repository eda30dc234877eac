"""One rank of the elastic torch tests (test_torch_elastic.py): `chute.torch.IterableDataset`
read by torchdata's `StatefulDataLoader` on real gloo ranks.

`python torch_elastic_worker.py CONFIG`, CONFIG a JSON object with `phase`, `rank`,
`world`, `port`, `workers` (torch DataLoader workers), `dir` and `out`:
- `save`: epoch 0 from the start; after STEPS batches, the ranks gather every rank's
  loader `state_dict()` (`all_gather_object`) and rank 0 writes them to `dir/states.json`;
  then the rank reads on to the end of the epoch (what an uninterrupted run delivers).
- `resume`: reads `dir/states.json`; with the world size and workers of the run that saved
  it, each rank loads its own loader state, else every rank loads the merged state
  (`merge_state_dicts`); reads the rest of epoch 0, then all of epoch 1.
Both write the element ids delivered, batch by batch, to `out`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader

import chute
import chute.torch

RECORDS = 90
STEPS = 3
BATCH = 4


def keep(x: int) -> bool:
    return x % 7 != 3


def kept() -> list[int]:
    """The elements of one epoch."""
    return [x for x in range(RECORDS) if keep(x)]


def dataset() -> chute.torch.IterableDataset:
    return chute.torch.IterableDataset(
        chute.MapDataset.range(RECORDS).shuffle(seed=5).filter(keep),
        batch_size=BATCH,
        shard_options=chute.torch.shard_by_torch_rank(),
        read_options=chute.ReadOptions(num_threads=0),
    )


def ids(batches: Any) -> list[list[int]]:
    return [b.tolist() for b in batches]


def main(cfg: dict[str, Any]) -> None:
    rank, world = cfg["rank"], cfg["world"]
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank, world_size=world
    )
    ds = dataset()
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=cfg["workers"])
    result: dict[str, Any] = {}
    if cfg["phase"] == "save":
        it = iter(loader)
        result["before"] = ids(next(it) for _ in range(STEPS))
        states: list[Any] = [None] * world
        dist.all_gather_object(states, loader.state_dict())
        if rank == 0:
            with open(f"{cfg['dir']}/states.json", "w") as f:
                json.dump({"world": world, "workers": cfg["workers"], "states": states}, f)
        result["after"] = ids(it)
    else:
        with open(f"{cfg['dir']}/states.json") as f:
            saved = json.load(f)
        if (saved["world"], saved["workers"]) == (world, cfg["workers"]):
            loader.load_state_dict(saved["states"][rank])  # exactly where this rank was
        else:
            ds.load_state_dict(chute.torch.IterableDataset.merge_state_dicts(saved["states"]))
        result["after"] = ids(loader)
        ds.set_epoch(1)
        result["next"] = ids(loader)
    dist.barrier()
    with open(cfg["out"], "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
