"""`chute.torch.IterableDataset`: a chute MapDataset read by `torch.utils.data.DataLoader`.

torch gives each of its worker processes a copy of an `IterableDataset`; a copy that does
not know which worker it is yields everything in every worker (every element twice with
2 workers). This adapter reads, in each copy, one epoch of the MapDataset at a time, cut
by position and never by content, so the parts are disjoint and cover the epoch:

    epoch e            positions [e*n, (e+1)*n) of dataset.repeat(e + 1)  (a new shuffle)
    rank r of R        ShardOptions(r, R).shard_slice(n) of those          (positions r::R)
    worker k of W      [k::W] of the rank's part                          (get_worker_info())

that is, copy `j = r + R*k` of `m = R*W` reads positions `j, j + m, ...` of the epoch: its
share of the layout `[0, stop)`, as a host of `ElasticIterator` does. Each copy's state is
its epoch, its share, how many positions of it it has read (elements carry their position
through the pipeline, so a filter does not blur it) and its chute iterator's state (a few
integers, the pipeline's identity), which `state_dict()` returns as torch's `Stateful`:
torchdata's `StatefulDataLoader` saves one per worker and hands each back to the same
worker. With another world size or worker count, `merge_state_dicts` takes the states of
all old copies and returns what none has read, `explicit ++ [start, stop)` (see
docs/elastic.md), which every new copy loads and deals out to itself by the same rule.
The states' checks and their merging are in `torch_states.py`.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from chute._src.core import contract
from chute._src.core.checkpointing import from_state_dict
from chute._src.core.dataset import INFINITE, MapDataset
from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import check_int
from chute._src.core.options import ReadOptions
from chute._src.core.seeding import same_params
from chute._src.core.state_checks import CHECKSUM_KEY, quote, seal, unseal
from chute._src.frameworks.elastic import (
    share_of_layout,
    stack_tagged,
    tagged_share,
)
from chute._src.frameworks.sharding import NoSharding, ShardOptions
from chute._src.frameworks.torch_states import (
    COPY_KEYS,
    MERGE_FIX,
    MERGED_KEYS,
    NAME,
    OLD_COPY_KEYS,
    check_copy,
    check_merged,
    fail,
    int_list,
    merge_state_dicts,
)
from chute._src.frameworks.torch_tensors import to_tensors

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


@dataclass(frozen=True)
class _Part:
    """One copy's share of an epoch: `pending`, then `next_index, next_index + stride, ...`
    below `stop` (positions of the epoch)."""

    pending: list[int]
    next_index: int
    stride: int
    stop: int

    def as_json(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "next_index": self.next_index,
            "stride": self.stride,
            "stop": self.stop,
        }


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
    `Stateful`); a state restores into the same rank and worker of the same world size and
    number of workers. With another world size or number of workers, every copy of the
    new run loads `IterableDataset.merge_state_dicts(states of all old copies)`, and the
    rest of the epoch is read once over all new ranks (docs/elastic.md).
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
        self._live: tuple[Any, _Part] | None = None  # the epoch's chute iterator and share
        self._read = 0  # positions of the live share read
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
        rank reads in `epoch` (from its start), as a MapDataset."""
        n = len(self._dataset)
        one_epoch = self._dataset.repeat(epoch + 1)[epoch * n : (epoch + 1) * n]
        return one_epoch[self._shard.shard_slice(n)][worker::num_workers]

    # -- where this copy reads ---------------------------------------------------------------

    def _where(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def _shard_key(self, worker: int, num_workers: int) -> list[int]:
        return [self._shard.shard_index, self._shard.shard_count, worker, num_workers]

    def _copy(self, worker: int, num_workers: int) -> tuple[int, int]:
        """This copy's place `j` among the `m` copies of the run."""
        r, world = self._shard.shard_index, self._shard.shard_count
        return r + world * worker, world * num_workers

    def _fresh_part(self, worker: int, num_workers: int) -> _Part:
        j, m = self._copy(worker, num_workers)
        return _Part([], j, m, self._shard.shard_slice(len(self._dataset)).stop)

    def _merged_part(self, merged: dict[str, Any], worker: int, num_workers: int) -> _Part:
        """This copy's share of what the old run left: `explicit ++ [start, stop)`, cut to
        a multiple of the world size first with `shard_options.drop_remainder`."""
        explicit, start, stop = list(merged["pending"]), merged["next_index"], merged["stop"]
        if self._shard.drop_remainder:
            tail = stop - start
            drop = (len(explicit) + tail) % self._shard.shard_count
            if drop <= tail:
                stop -= drop
            else:
                explicit, stop = explicit[: len(explicit) - (drop - tail)], start
        j, m = self._copy(worker, num_workers)
        pending, next_index = share_of_layout(explicit, start, j, m)
        return _Part(pending, next_index, m, stop)

    def _start(
        self, state: dict[str, Any] | None, worker: int, num_workers: int
    ) -> tuple[_Part, Any, int]:
        """The share, chute iterator state and positions read that an iteration starts
        from: a loaded state's, else the epoch's start."""
        key = self._shard_key(worker, num_workers)
        if state is None:
            return self._fresh_part(worker, num_workers), None, 0
        if "merged_from" in state:
            if state["merged_from"] != [key[1], key[3]]:
                return self._merged_part(state, worker, num_workers), None, 0
            # the same world size and workers: each copy continues exactly from its own state
            own = next(c for c in state["copies"] if c["shard"] == key)
            if own["epoch"] > state["epoch"]:  # it had read its share of the epoch
                _, m = self._copy(worker, num_workers)
                return _Part([], state["stop"], m, state["stop"]), None, 0
            state = own
        if state["shard"] != key:
            raise CheckpointError(self._wrong_shard(state["shard"], worker, num_workers))
        p = state["part"]
        part = _Part(p["pending"], p["next_index"], p["stride"], p["stop"])
        return part, state["iterator"], state["read"]

    def _pipeline(self, part: _Part, epoch: int | None = None) -> Any:
        """The share's elements (batched), each as `(position in the share, element)`, of
        this iteration's epoch (or of `epoch`)."""
        n, e = len(self._dataset), self._epoch if epoch is None else epoch
        one_epoch = self._dataset.repeat(e + 1)[e * n : (e + 1) * n][: part.stop]
        share = tagged_share(one_epoch, part.pending, part.next_index, part.stride)
        ds = share.to_iter_dataset(self._read_options)
        if self._batch_size is not None:
            ds = ds.batch(
                self._batch_size, drop_remainder=self._drop_remainder, batch_fn=stack_tagged
            )
        return ds

    def __iter__(self) -> Iterator[Any]:
        worker, num_workers = self._where()
        state, self._pending = self._pending, None  # taken by this iteration
        part, iterator_state, read = self._start(state, worker, num_workers)
        it = iter(self._pipeline(part))
        if iterator_state is not None:
            it.load_state_dict(iterator_state)
        self._live, self._read = (it, part), read
        return _Epoch(self, it)

    def _elements(self, it: Any) -> Generator[Any, None, None]:
        try:
            for position, element in it:
                self._read = position + 1
                yield to_tensors(element) if self._tensors else element
            self._epoch += 1
        finally:
            if self._live is not None and self._live[0] is it:
                self._live = None
            it.close()

    def _wrong_shard(self, key: list[int], worker: int, num_workers: int) -> str:
        r, w, k, nk = key
        return (
            f"chute.torch.IterableDataset: the state is of rank {r} of {w}, torch worker {k} "
            f"of {nk}, but it is loaded into rank {self._shard.shard_index} of "
            f"{self._shard.shard_count}, worker {worker} of {num_workers}: each worker "
            "restores its own state (torchdata's StatefulDataLoader does this); resume with "
            f"the world size and num_workers of the run that saved it, or, {MERGE_FIX}."
        )

    def _provenance(
        self, state: Any, steps: list[int], any_rank: bool = False
    ) -> list[list[dict[str, Any]]]:
        """`chute.experimental.provenance` of this dataset's steps, the state of one of its
        copies (`state_dict()`, or a torchdata `StatefulDataLoader`'s, which holds them)
        naming the rank and the number of torch workers (`frameworks/torch_provenance.py`).
        `any_rank`: the state may be another rank's of the same run (`hosts=`)."""
        from chute._src.frameworks.torch_provenance import steps_of
        from chute._src.frameworks.torch_skip import copy_states

        return steps_of(self, copy_states(state)[0], steps, any_rank=any_rank)

    def _skip_state(self, state: Any, n: int) -> Any:
        """`chute.experimental.skip_state` of a copy's `state_dict()` (with `num_workers=0`)
        or of a torchdata `StatefulDataLoader`'s: `n` of the loader's steps on, within the
        epoch (`frameworks/torch_skip.py`)."""
        from chute._src.frameworks.torch_skip import skip_state

        return skip_state(self, state, n)

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This copy's position: its epoch, which part it reads (its share of the epoch),
        how many positions of it it has read and its chute iterator's state after the last
        element it yielded (None at the start of an epoch), with a checksum of them
        (`load_state_dict` rejects a state changed after it was saved). A loaded state not
        yet read from is returned as it was loaded, a merged one as this copy's share."""
        if self._pending is not None and "merged_from" not in self._pending:
            return dict(seal(self._pending, any_dict=True))
        worker, num_workers = self._where()
        if self._live is not None:
            it, part = self._live
            position, read = it.state_dict(), self._read
        elif self._pending is not None:
            part, position, read = self._start(self._pending, worker, num_workers)
        else:
            part, position, read = self._fresh_part(worker, num_workers), None, 0
        state: dict[str, Any] = seal(
            {
                "epoch": self._epoch,
                "shard": self._shard_key(worker, num_workers),
                "pipeline": list(contract.identity(self._dataset)),
                "length": len(self._dataset),
                "part": part.as_json(),
                "read": read,
                "iterator": position,
            },
            any_dict=True,
        )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The next iteration continues where `state_dict()` was taken, or, given what
        `merge_state_dicts` returned, reads this copy's share of what the old run left.

        Raises `CheckpointError` for a state changed after it was saved (its checksum; one
        without a checksum is restored unchecked), one of another dataset, or one that is
        not a state."""
        where = f"{NAME}.load_state_dict"
        keys = set(state_dict) - {CHECKSUM_KEY} if isinstance(state_dict, dict) else set()
        if keys == OLD_COPY_KEYS and CHECKSUM_KEY not in state_dict:
            state_dict = self._from_older_version(state_dict, where)
            keys = set(COPY_KEYS)
        if keys not in (COPY_KEYS, MERGED_KEYS):
            raise CheckpointError(
                f"{where}: got {quote(state_dict)}, expected the dict state_dict() returns "
                f"(keys {sorted(COPY_KEYS)} and 'checksum') or one merge_state_dicts() "
                "returns."
            )
        state = unseal(state_dict, where, "state_dict", any_dict=True)
        if keys == MERGED_KEYS:
            check_merged(state, where, "state_dict")
        else:
            check_copy(state, where, "state_dict")
        recorded, identity = list(state["pipeline"]), list(contract.identity(self._dataset))
        same = len(recorded) == len(identity) and all(map(same_params, recorded, identity))
        if not same or state["length"] != len(self._dataset):
            raise CheckpointError(
                f"{where}: state_dict['pipeline'] = {quote(recorded)} (length "
                f"{quote(state['length'])}) is not this dataset's {quote(identity)} (length "
                f"{len(self._dataset)}): restore a state taken with the same dataset (same "
                "sources, seeds, slicing and stages)."
            )
        self._epoch = state["epoch"]
        self._pending = state

    def _from_older_version(self, state_dict: dict[str, Any], where: str) -> dict[str, Any]:
        """A state saved by chute before states could be merged (`{"epoch", "shard",
        "iterator"}`: the copy read positions `[worker::num_workers]` of its rank's
        `shard_slice`, the ones a fresh share reads, up to its iterator's `next_index`), as
        this version's state of the same share, read from that index on."""
        epoch, shard = state_dict["epoch"], state_dict["shard"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise fail(where, "state_dict['epoch']", epoch, "it must be an int >= 0")
        if not int_list(shard) or len(shard) != 4:
            raise fail(
                where,
                "state_dict['shard']",
                shard,
                "it must be [rank, world size, worker, workers]",
            )
        rank, world, worker, workers = shard
        if not (0 <= rank < world and 0 <= worker < workers):
            raise fail(where, "state_dict['shard']", shard, "a rank or worker out of range")
        n, identity = len(self._dataset), list(contract.identity(self._dataset))
        read = 0
        if state_dict["iterator"] is not None:
            node: Any = from_state_dict(state_dict["iterator"])
            while isinstance(node, dict) and node.get("stage") != "to_iter_dataset":
                node = node.get("parent")
            if not isinstance(node, dict):
                raise fail(
                    where,
                    "state_dict['iterator']",
                    state_dict["iterator"],
                    "it holds no reader's state",
                )
            read = check_int(node, "next_index", f"{where}: state_dict['iterator']", 0, n)
            recorded = node.get("pipeline")
            if (
                not isinstance(recorded, list)
                or len(recorded) <= len(identity)
                or not all(map(same_params, recorded, identity))
            ):
                raise CheckpointError(
                    f"{where}: the state's pipeline {quote(recorded)} does not begin with this "
                    f"dataset's {quote(identity)}: restore a state taken with the same dataset "
                    "(same sources, seeds, slicing and stages)."
                )
        stop = (
            ShardOptions(rank, world, drop_remainder=self._shard.drop_remainder).shard_slice(n).stop
        )
        start, stride = rank + world * worker, world * workers
        part = {"pending": [], "next_index": start + stride * read, "stride": stride}
        return {
            "epoch": epoch,
            "shard": list(shard),
            "pipeline": identity,
            "length": n,
            "part": {**part, "stop": stop},
            "read": 0,
            "iterator": None,
        }

    @staticmethod
    def merge_state_dicts(states: Sequence[Any]) -> dict[str, Any]:
        """What the copies of an old run have not read of the epoch, from the states of all
        of them, for `load_state_dict` on every copy of a new run with any world size and
        number of workers.

        `states` holds, in any order, every old copy's `state_dict()` exactly once, or
        what holds them: a torchdata `StatefulDataLoader`'s `state_dict()` (one per
        worker, or the dataset's with `num_workers=0`), one per old rank. docs/elastic.md.
        """
        return merge_state_dicts(states)

    def __repr__(self) -> str:
        return (
            f"chute.torch.IterableDataset({self._dataset!r}, batch_size={self._batch_size}, "
            f"shard={self._shard.shard_index}/{self._shard.shard_count}, epoch={self._epoch})"
        )


class _Epoch(Iterator[Any]):
    """What `iter(IterableDataset)` returns: the epoch's elements, read by the copy's chute
    iterator `it`. `chute.experimental.skip` moves it through `_skip` (O(1) where the
    positions are index arithmetic). No `state_dict` here: the dataset holds the state."""

    def __init__(self, ds: IterableDataset, it: Any) -> None:
        self._ds, self._it = ds, it
        self._gen = ds._elements(it)

    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> Any:
        return next(self._gen)

    def close(self) -> None:
        self._gen.close()

    def _skip(self, n: int) -> int:
        """Moves the copy `n` elements (or batches) on, as far as its share goes."""
        from chute._src.core.next_index import _reader_path
        from chute._src.core.skip import skip

        live = self._ds._live
        if live is None or live[0] is not self._it:
            # Not the copy's live iteration (it ended, or a newer one started): read it.
            return sum(1 for _ in zip(range(n), self))
        done = skip(self._it, n)
        if done:
            reader = _reader_path(self._it.get_state(), "skip")[-1]
            self._ds._read = int(reader["next_index"])
        return done
