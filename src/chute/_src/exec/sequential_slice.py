"""`sequential_slice=True` of `mp_prefetch` and `multithread_prefetch`: Grain's order of
`n` contiguous shares, one per worker, taken in turn.

Grain's workers each read a share of the data and the consumer takes their outputs in
turn; with `sequential_slice=True` a worker's share is contiguous, so the order depends
on the worker count (10 elements over 3 workers come out 0, 4, 7, 1, 5, 8, 2, 6, 9, 3).
chute's output never depends on how many processes compute it, and without the option it
is in index order, as Grain's then is for such a pipeline. With the option, the pipeline
is rebuilt as Grain's would run: `n` copies of it, copy `i` reading share `i`, interleaved
one element at a time (`InterleaveIterDataset(copies, cycle_length=n)`), and then computed
as any other pipeline (its output is the same for any number of processes; `n` is a
parameter of the order, recorded in states).

A copy's share: each `to_iter_dataset` reads the contiguous share `i` of its MapDataset's
positions (Grain's `even_split`: the first `len % n` shares one longer); each stage that
reads shards (an interleave, Parquet files) reads its inputs `i::n`, as Grain's do. A
stream with neither (an `IterDataset` source of its own) cannot be divided: it raises, in
Grain's words.
"""

from __future__ import annotations

import copy
from typing import Any

from chute._src.core import contract
from chute._src.core.contract import StageRole
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset, rewrite, walk
from chute._src.core.set_slice import contiguous_share, reset_memos
from chute._src.ops.interleave import InterleaveIterDataset


def sequential_shares(ds: IterDataset[Any], count: int, where: str) -> IterDataset[Any]:
    """`ds` as `count` copies, copy `i` reading contiguous share `i`, interleaved.

    >>> import chute
    >>> ds = chute.MapDataset.range(10).to_iter_dataset()
    >>> list(sequential_shares(ds, 3, "mp_prefetch"))
    [0, 4, 7, 1, 5, 8, 2, 6, 9, 3]
    """
    copies = [_share(ds, i, count, where) for i in range(count)]
    return InterleaveIterDataset(copies, cycle_length=count, parallelism=0)


def _divides(node: Any) -> bool:
    """Where a copy's share is taken (`rewrite` hands it over whole): a reader, a stage
    reading shards, or a stream source."""
    return (
        contract.role(node) is StageRole.READER or contract.reads_shards(node) or not node.parents
    )


def _share(ds: IterDataset[Any], index: int, count: int, where: str) -> IterDataset[Any]:
    """Copy `index` of `ds`: the readers and shard readers below it take share `index`."""

    originals = {id(n) for n in walk(ds, _divides)}

    def take(node: Any) -> Any:
        if _divides(node):
            node = _share_of(node, index, count, where)
        elif id(node) in originals:
            return node  # nothing below it changed
        reset_memos(node)  # rebuilt on its parents' shares: its identity is the share's
        return node

    return rewrite(ds, take, stop=_divides)


def _share_of(node: Any, index: int, count: int, where: str) -> Any:
    if contract.role(node) is StageRole.READER:
        parent: MapDataset[Any] = node.parents[0]
        n = len(parent)
        if n >= INFINITE:
            raise ValueError(
                f"{where}: sequential_slice=True divides the positions of {parent!r} into "
                f"{count} contiguous shares, but it repeats forever: repeat after the "
                "prefetch instead, or leave sequential_slice False."
            )
        start, end = contiguous_share(n, slice(index, None, count), True, where)
        out = contract.with_parents(node, [parent.slice(slice(start, end))])
    elif contract.reads_shards(node):
        out = copy.copy(node)
        out.set_slice(slice(index, None, count))  # its inputs index::count, as in Grain
    elif not node.parents:
        raise ValueError(
            f"{where}: sequential_slice=True gives each of {count} workers a share of the "
            f"data, but {node!r} is one stream that cannot be divided: build the pipeline "
            "on a MapDataset (to_iter_dataset) or on an InterleaveIterDataset of shards, or "
            "leave sequential_slice False. (In Grain's words: Cannot slice `IterDataset` "
            f"source. {type(node)})"
        )
    return out
