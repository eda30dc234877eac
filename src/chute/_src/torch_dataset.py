"""`chute.torch.IterableDataset`: a chute MapDataset read by `torch.utils.data.DataLoader`.

torch gives each of its worker processes a copy of an `IterableDataset`; a copy that does
not know which worker it is yields everything in every worker (every element twice with
2 workers). This adapter reads, in each copy, one epoch of the MapDataset at a time, cut
by position and never by content, so the parts are disjoint and cover the epoch:

    epoch e            positions [e*n, (e+1)*n) of dataset.repeat(e + 1)  (a new shuffle)
    rank r of R        ShardOptions(r, R).shard_slice(n) of those          (positions r::R)
    worker k of W      [k::W] of the rank's part                          (get_worker_info())

Each copy's state is its epoch and the state of its chute iterator (a few integers, the
pipeline's identity), which `state_dict()` returns as torch's `Stateful`: torchdata's
`StatefulDataLoader` saves one per worker and hands each back to the same worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from chute._src.checkpointing import from_state_dict
from chute._src.dataset import INFINITE, MapDataset
from chute._src.errors import CheckpointError
from chute._src.options import ReadOptions
from chute._src.sharding import NoSharding, ShardOptions
from chute._src.state_checks import CHECKSUM_KEY, quote, seal, unseal
from chute._src.torch_tensors import to_tensors

try:
    import torch
    import torch.utils.data
except ImportError as e:  # pragma: no cover - the torch extra is installed for the tests
    raise ImportError(
        "chute.torch needs PyTorch, which is not installed: pip install 'chute[torch]'."
    ) from e


def shard_by_torch_rank(drop_remainder: bool = False) -> ShardOptions:
    """ShardOptions for this rank of `torch.distributed`: shard `get_rank()` of
    `get_world_size()`. `ValueError` outside a distributed run (no process group).

    With `drop_remainder`, every rank gets the same number of elements, which
    `DistributedDataParallel` needs (a rank with one batch more waits forever in its last
    all-reduce).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "shard_by_torch_rank: this is not a torch.distributed run (no process group is "
            "initialized): call torch.distributed.init_process_group() first, or catch this "
            "ValueError and read all data in a standalone run."
        )
    return ShardOptions(dist.get_rank(), dist.get_world_size(), drop_remainder=drop_remainder)


def _default_shard_options() -> ShardOptions:
    try:
        return shard_by_torch_rank()
    except ValueError:
        return NoSharding()


class IterableDataset(torch.utils.data.IterableDataset[Any]):
    """`dataset` (a chute MapDataset, or any object with `__len__` and `__getitem__`, such
    as a Hugging Face `datasets.Dataset`) as a torch `IterableDataset`.

    Each iteration reads the rest of the current epoch of this rank's and this torch
    worker's part (see the module's docstring); an epoch read to its end moves on to the
    next, so re-iterating gets a new shuffle (from a `shuffle` in `dataset`). `set_epoch(n)`
    chooses the epoch, as `DistributedSampler.set_epoch` does; call it before each epoch
    when torch starts fresh workers per epoch (its default), since their copies start
    from this object's epoch.

    `batch_size` batches in chute (`IterDataset.batch`) within each worker's part, as
    torch does for an IterableDataset: give the DataLoader `batch_size=None`. `tensors`
    turns numeric arrays into tensors without copying (`to_tensors`). `shard_options`
    defaults to `shard_by_torch_rank()` in a distributed run, else all data.
    `read_options` are `to_iter_dataset`'s (threads per torch worker).

    `state_dict()`/`load_state_dict()` save and restore the position (torch's
    `Stateful`); a state restores only into the same rank and worker of the same
    world size and number of workers.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int | None = None,
        drop_remainder: bool = False,
        shard_options: ShardOptions | None = None,
        read_options: ReadOptions | None = None,
        tensors: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(dataset, MapDataset):
            if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
                raise TypeError(
                    f"chute.torch.IterableDataset: dataset={dataset!r} is neither a "
                    "chute.MapDataset nor a random-access source (__len__ and __getitem__): "
                    "the adapter shards by position; for a stream, build the pipeline with "
                    "chute (mp_prefetch for workers) and iterate it directly."
                )
            dataset = MapDataset.source(dataset)
        if len(dataset) >= INFINITE:
            raise ValueError(
                f"chute.torch.IterableDataset: {dataset!r} repeats forever, but the adapter "
                "reads one epoch per iteration and repeats by itself (set_epoch): remove "
                "the .repeat()."
            )
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0
        ):
            raise ValueError(
                f"chute.torch.IterableDataset: batch_size={batch_size!r} is invalid: it must "
                "be a positive int, or None for single elements."
            )
        if shard_options is not None and not isinstance(shard_options, ShardOptions):
            raise TypeError(
                f"chute.torch.IterableDataset: shard_options={shard_options!r} is not a "
                "chute.sharding.ShardOptions: use shard_by_torch_rank() or "
                "ShardOptions(rank, world_size)."
            )
        self._dataset = dataset
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._shard = shard_options if shard_options is not None else _default_shard_options()
        self._read_options = read_options
        self._tensors = tensors
        self._epoch = 0
        self._live: Any = None  # the chute iterator of the epoch being read
        self._pending: dict[str, Any] | None = None  # a loaded state, for the next __iter__

    @property
    def shard_options(self) -> ShardOptions:
        return self._shard

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads (or is reading)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Reads epoch `epoch` next, from its start (a loaded state is dropped)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(
                f"set_epoch: epoch={epoch!r} is invalid: it must be an int >= 0, e.g. the "
                "training loop's epoch counter."
            )
        self._epoch = epoch
        self._pending = None

    def part(self, epoch: int, worker: int = 0, num_workers: int = 1) -> MapDataset[Any]:
        """The positions of `dataset` that torch worker `worker` of `num_workers` of this
        rank reads in `epoch`, as a MapDataset."""
        n = len(self._dataset)
        one_epoch = self._dataset.repeat(epoch + 1)[epoch * n : (epoch + 1) * n]
        return one_epoch[self._shard.shard_slice(n)][worker::num_workers]

    def _where(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def _shard_key(self, worker: int, num_workers: int) -> list[int]:
        return [self._shard.shard_index, self._shard.shard_count, worker, num_workers]

    def __iter__(self) -> Iterator[Any]:
        worker, num_workers = self._where()
        ds = self.part(self._epoch, worker, num_workers).to_iter_dataset(self._read_options)
        if self._batch_size is not None:
            ds = ds.batch(self._batch_size, drop_remainder=self._drop_remainder)
        it = iter(ds)
        pending, self._pending = self._pending, None
        if pending is not None:
            if pending["shard"] != self._shard_key(worker, num_workers):
                raise CheckpointError(self._wrong_shard(pending["shard"], worker, num_workers))
            if pending["iterator"] is not None:
                it.load_state_dict(pending["iterator"])
        self._live = it
        return self._read(it)

    def _read(self, it: Any) -> Iterator[Any]:
        try:
            for element in it:
                yield to_tensors(element) if self._tensors else element
            self._epoch += 1
        finally:
            if self._live is it:
                self._live = None
            it.close()

    def _wrong_shard(self, key: list[int], worker: int, num_workers: int) -> str:
        r, w, k, nk = key
        return (
            f"chute.torch.IterableDataset: the state is of rank {r} of {w}, torch worker {k} "
            f"of {nk}, but it is loaded into rank {self._shard.shard_index} of "
            f"{self._shard.shard_count}, worker {worker} of {num_workers}: each worker "
            "restores its own state (torchdata's StatefulDataLoader does this); resume with "
            "the world size and num_workers of the run that saved it."
        )

    def state_dict(self) -> dict[str, Any]:
        """This copy's position: its epoch, which part it reads, and its chute iterator's
        state after the last element it yielded (None at the start of an epoch), with a
        checksum of them (`load_state_dict` rejects a state changed after it was saved)."""
        worker, num_workers = self._where()
        if self._live is not None:
            position: Any = self._live.state_dict()
        elif self._pending is not None:
            position = self._pending["iterator"]
        else:
            position = None
        state: dict[str, Any] = seal(
            {
                "epoch": self._epoch,
                "shard": self._shard_key(worker, num_workers),
                "iterator": position,
            },
            any_dict=True,
        )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The next iteration continues where `state_dict()` was taken.

        Raises `CheckpointError` for a state changed after it was saved (its checksum; one
        without a checksum is restored unchecked) or one that is not a state."""
        keys = {"epoch", "shard", "iterator"}
        if not isinstance(state_dict, dict) or set(state_dict) - {CHECKSUM_KEY} != keys:
            raise CheckpointError(
                f"chute.torch.IterableDataset.load_state_dict: got {quote(state_dict)}, "
                "expected the dict state_dict() returns (keys 'epoch', 'shard', 'iterator', "
                "'checksum')."
            )
        state_dict = unseal(
            state_dict, "chute.torch.IterableDataset.load_state_dict", "state_dict", any_dict=True
        )
        epoch, shard = state_dict["epoch"], state_dict["shard"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise CheckpointError(
                f"chute.torch.IterableDataset.load_state_dict: epoch={quote(epoch)} is invalid: it "
                "must be an int >= 0; pass what state_dict() returned."
            )
        if not (
            isinstance(shard, list) and len(shard) == 4 and all(isinstance(x, int) for x in shard)
        ):
            raise CheckpointError(
                f"chute.torch.IterableDataset.load_state_dict: shard={quote(shard)} is invalid: it "
                "must be [rank, world size, worker, workers]; pass what state_dict() returned."
            )
        if state_dict["iterator"] is not None:
            from_state_dict(state_dict["iterator"])  # checked now, restored by __iter__
        self._epoch = epoch
        self._pending = {"shard": list(shard), "iterator": state_dict["iterator"]}

    def __repr__(self) -> str:
        return (
            f"chute.torch.IterableDataset({self._dataset!r}, batch_size={self._batch_size}, "
            f"shard={self._shard.shard_index}/{self._shard.shard_count}, epoch={self._epoch})"
        )
