"""One rank of the 2-rank gloo training test (test_torch.py): a tiny model trained with
`DistributedDataParallel` on `chute.torch.IterableDataset`, read by torchdata's
`StatefulDataLoader` with 2 torch workers.

`python torch_train_worker.py PHASE RANK PORT CKPT_DIR OUT`:
- `train`: epoch 0 from the start; after SAVE_AT steps saves the model, the optimizer and
  the loader (`state_dict()`s, one file per rank), then trains to the end of the epoch.
- `resume`: a fresh model, optimizer and loader, loaded from those files, train to the end.
Both write the ids of the batches trained on after the checkpoint, and the final weights.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torchdata.stateful_dataloader import StatefulDataLoader

import chute
import chute.torch

SAVE_AT = 3
WORLD_SIZE = 2
RECORDS = 64


class Rows:
    """A map-style source of dicts, as a Hugging Face dataset is."""

    def __len__(self) -> int:
        return RECORDS

    def __getitem__(self, i: int) -> dict[str, object]:
        x = np.linspace(-1, 1, 4, dtype=np.float32) * (i % 7)
        return {"id": i, "x": x, "y": np.float32(x.sum() * 0.5 + 1)}


def loader(rank: int) -> StatefulDataLoader:
    ds = chute.torch.IterableDataset(
        chute.MapDataset.source(Rows()).shuffle(seed=11),
        batch_size=4,
        drop_remainder=True,
        shard_options=chute.torch.shard_by_torch_rank(drop_remainder=True),
        read_options=chute.ReadOptions(num_threads=0),
    )
    assert ds.shard_options.shard_index == rank
    return StatefulDataLoader(ds, batch_size=None, num_workers=2)


def main(phase: str, rank: int, port: int, ckpt_dir: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = loader(rank)
    path = f"{ckpt_dir}/rank{rank}.pt"
    if phase == "resume":
        saved = torch.load(path, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        data.load_state_dict(saved["data"])
    after: list[list[int]] = []
    step = 0
    for batch in data:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
        loss.backward()
        opt.step()
        step += 1
        if phase == "train" and step == SAVE_AT:
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "data": data.state_dict(),
            }
            torch.save(state, path)
        elif phase == "resume" or step > SAVE_AT:
            after.append(batch["id"].tolist())
    result = {
        "rank": rank,
        "steps": step,
        "after": after,
        "weights": [p.detach().flatten().tolist() for p in model.parameters()],
    }
    with open(out, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
