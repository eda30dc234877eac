"""chute in PyTorch (the `[torch]` extra): batches as tensors, and a torch `IterableDataset`.

- `to_tensors(tree)`: numeric numpy arrays as tensors sharing their memory (no copy, also
  for arrays in the shared memory of `mp_prefetch`'s workers); `pin_memory(tree)` copies
  them into page-locked memory, and `pin_memory(ds)` does so for every batch of an
  `IterDataset` (or iterator) in a background thread, ahead of the loop and with exact
  checkpoints, as `DataLoader(pin_memory=True)` does.
- `IterableDataset(dataset, ...)`: a MapDataset (or a map-style source such as a Hugging
  Face dataset) for `torch.utils.data.DataLoader`, cut by rank and by torch worker with no
  duplicates and no gaps; `set_epoch(n)` for a new shuffle per epoch; `state_dict()` /
  `load_state_dict()` (torchdata's `StatefulDataLoader` saves one per worker);
  `IterableDataset.merge_state_dicts(states)` of all ranks' states resumes with another
  world size or number of workers (docs/elastic.md).
- `shard_by_torch_rank()`: `ShardOptions` from `torch.distributed`'s rank and world size.

See docs/frameworks.md.
"""

from chute._src.frameworks.torch_dataset import IterableDataset as IterableDataset
from chute._src.frameworks.torch_dataset import shard_by_torch_rank as shard_by_torch_rank
from chute._src.frameworks.torch_tensors import pin_memory as pin_memory
from chute._src.frameworks.torch_tensors import to_tensors as to_tensors

__all__ = ["IterableDataset", "pin_memory", "shard_by_torch_rank", "to_tensors"]
