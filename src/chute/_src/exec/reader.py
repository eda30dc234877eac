"""`MapDataset.to_iter_dataset`: iterate a `MapDataset` in index order, in blocks.

The reader keeps the position (the index of the next element to hand out: its whole
state) and the block being consumed; a `ChunkExecutor` (`_src/exec/executors.py`) computes the
blocks: on the consumer's thread with `num_threads=0`, on a thread pool otherwise, in
worker processes under `mp_prefetch`. Element `i` is `ds[i]` whichever computes it, so
the output and the state do not depend on threads or workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

from chute._src.core import contract, observe, provenance
from chute._src.core.columns import Columns
from chute._src.core.contract import StageRole
from chute._src.core.dataset import INFINITE, IterDataset, MapDataset
from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import MAX_POSITION, DatasetIterator, check_int, int_at
from chute._src.core.options import ReadOptions
from chute._src.core.seeding import same_params
from chute._src.exec.autotune import AUTOTUNE, Tuning
from chute._src.exec.executors import (
    Autotuned,
    Chunk,
    ChunkExecutor,
    InProcess,
    Parallelism,
    Threads,
    nbytes,
)
from chute._src.ops.filter_check import SkipCounter

T = TypeVar("T")


class PrefetchIterDataset(IterDataset[T]):
    """An `IterDataset` over a `MapDataset`, skipping filtered (None) elements (or, with
    `allow_nones=True`, handing them out as None, as Grain does)."""

    _role = StageRole.READER

    def __init__(
        self,
        parent: MapDataset[T],
        read_options: ReadOptions | None = None,
        *,
        allow_nones: bool = False,
    ) -> None:
        if not isinstance(parent, MapDataset):
            raise TypeError(f"to_iter_dataset needs a MapDataset, got {type(parent).__name__}")
        if read_options is not None and not isinstance(read_options, ReadOptions):
            raise TypeError(
                f"to_iter_dataset: read_options={read_options!r} is not a ReadOptions: pass "
                "chute.ReadOptions(num_threads=..., prefetch_buffer_size=...)."
            )
        super().__init__([parent])
        self._read_options = read_options or ReadOptions()
        self._allow_nones = bool(allow_nones)
        self._executor_factory: Callable[[], ChunkExecutor] | None = None

    @property
    def map_parent(self) -> MapDataset[T]:
        return self._parents[0]  # type: ignore[return-value]

    @property
    def read_options(self) -> ReadOptions:
        return self._read_options

    @property
    def _threaded(self) -> bool:
        # As Grain: threads only with room to compute ahead (prefetch_buffer_size > 0).
        # AUTOTUNE may choose threads (it may also choose none).
        options = self._read_options
        return options.num_threads != 0 and options.prefetch_buffer_size != 0

    @property
    def _hands_out_nones(self) -> bool:
        """Whether filtered elements come out as None (Grain's `allow_nones`) instead of
        being skipped."""
        return self._allow_nones

    @property
    def _concurrent(self) -> bool:
        return self._executor_factory is not None or self._threaded

    def _cache_identity(self) -> dict[str, Any]:
        identity = super()._cache_identity()
        del identity["_read_options"]  # threads and buffer sizes: the same elements
        return identity

    def _with_parents(self, parents: Sequence[Any]) -> Self:
        new = super()._with_parents(parents)
        new._executor_factory = self._executor_factory  # set after `__init__`: kept
        return new

    def _with_executor(self, factory: Callable[[], ChunkExecutor]) -> Self:
        """This reader with its chunks computed by `factory()`'s executor (which may compute
        another, equivalent MapDataset); state and fingerprint stay the parent's."""
        new = self._with_parents(self._parents)
        new._executor_factory = factory
        return new

    def _make_iterator(self) -> PrefetchDatasetIterator[T]:
        if self._executor_factory is not None:
            return PrefetchDatasetIterator(
                self.map_parent, self._executor_factory(), self._allow_nones
            )
        ds = self.map_parent
        observer = observe.observing()
        if observer is not None:
            ds = observer.map_chain(ds)
        threads, buffer = self._read_options.num_threads, self._read_options.prefetch_buffer_size
        executor: ChunkExecutor
        if not self._threaded:
            executor = InProcess(ds)
        elif threads is AUTOTUNE or buffer is AUTOTUNE:
            executor = Autotuned(
                ds,
                None if threads is AUTOTUNE else threads,
                None if buffer is AUTOTUNE else buffer,
            )
        else:
            executor = Threads(ds, threads, buffer)
        return PrefetchDatasetIterator(self.map_parent, executor, self._allow_nones)

    def __repr__(self) -> str:
        if self._executor_factory is not None:
            return f"PrefetchIterDataset(read_options={self._read_options}) in worker processes"
        return f"PrefetchIterDataset(read_options={self._read_options})"

    @property
    def _identity(self) -> tuple[str, ...]:
        return contract.identity(self.map_parent)

    @property
    def _fingerprint(self) -> str:
        return contract.fingerprint(self.map_parent)

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """Step `position` is element `position` of the MapDataset; where a filter there
        leaves holes, the `position`-th element kept, found by running the filters' part
        of the MapDataset (not the stages above them) up to it."""
        parent = self.map_parent
        n = len(parent)
        if self._allow_nones or not parent._may_be_none:
            if position >= n:
                raise provenance.EndOfStream
            return provenance.same_position(position)
        memo = tracer.memo(self)
        kept: list[int] = memo.setdefault("kept", [])
        while len(kept) <= position:
            i = memo.get("next", 0)
            if i >= n:
                raise provenance.EndOfStream
            memo["next"] = i + 1
            if provenance.records_of(parent, i, tracer):
                kept.append(i)
        return provenance.same_position(kept[position])


class PrefetchDatasetIterator(DatasetIterator[T]):
    stage = "to_iter_dataset"

    def __init__(
        self, ds: MapDataset[T], executor: ChunkExecutor, allow_nones: bool = False
    ) -> None:
        super().__init__()
        self._executor = executor
        self.bound_to_thread = executor.bound_to_thread
        self._len = len(ds)
        # Filters moved into the workers leave Nones in the computed dataset too.
        self._skip_none = not allow_nones and (ds._may_be_none or executor.ds._may_be_none)
        self._identity = contract.identity(ds)
        self._filtered = SkipCounter(ds, "to_iter_dataset over ")
        self._read = self._nones = 0  # positions read, filtered ones among them (warning)
        self._buf: Chunk = []  # the chunk being consumed
        self._pos = 0
        self._buf_start = 0  # index of _buf[0]
        self._closed = False

    # -- the hot path ----------------------------------------------------------------------

    def __next__(self) -> T:
        while True:
            pos = self._pos
            if pos < len(self._buf):
                self._pos = pos + 1
                x = self._buf[pos]
                if x is None and self._skip_none:
                    continue
                return x
            self._fill()

    def _next_many(self, n: int) -> list[T]:
        out: list[T] = []
        while len(out) < n:
            pos = self._pos
            if pos >= len(self._buf):
                try:
                    self._fill()
                except StopIteration:
                    break
                continue
            take = self._buf[pos : pos + n - len(out)]
            self._pos = pos + len(take)
            if self._skip_none:
                out.extend(x for x in take if x is not None)
            else:
                out.extend(take)
        return out

    def _next_columns(self, n: int) -> list[T] | Columns:
        # Columns while the chunks are columns of one structure: the views of each chunk's
        # part, joined (one copy) when the batch spans chunks. Elements one by one otherwise.
        pieces: list[Columns] = []
        got = 0
        while got < n:
            pos, buf = self._pos, self._buf
            if pos >= len(buf):
                try:
                    self._fill()
                except StopIteration:
                    break
                continue
            if not isinstance(buf, Columns) or (pieces and buf.skeleton != pieces[0].skeleton):
                if not pieces:
                    return self._next_many(n)
                rows: list[Any] = [x for piece in pieces for x in piece]
                return rows + self._next_many(n - got)
            take = min(n - got, len(buf) - pos)
            pieces.append(buf.take(pos, pos + take))
            self._pos = pos + take
            got += take
        return Columns.join(pieces) if pieces else []

    def _fill(self) -> None:
        """Replaces the consumed buffer with the next block; StopIteration at the end."""
        start = self._buf_start + len(self._buf)
        if start >= self._len:
            self._buf, self._pos, self._buf_start = [], 0, start
            self._executor.release()  # nothing more to compute: free the threads now
            raise StopIteration
        if self._closed:
            raise RuntimeError("next() on a closed iterator: create a new one with iter(ds).")
        items = self._executor.next_chunk(start)
        self._buf, self._pos, self._buf_start = items, 0, start
        if self._skip_none:
            self._read += len(items)
            if not isinstance(items, Columns):  # (which hold no None)
                self._nones += sum(1 for x in items if x is None)  # not count(): arrays use ==
            self._filtered.update(self._read, self._nones)

    # -- state and lifecycle ---------------------------------------------------------------

    def own_state(self) -> dict[str, Any]:
        return {"next_index": self._buf_start + self._pos, "pipeline": list(self._identity)}

    def _count_at(self, state: Any) -> int | None:
        # Exact unless filtered (None) elements are skipped.
        return None if self._skip_none else int_at(state, "next_index")

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        check_identity(state["pipeline"], self._identity, f"{path}['pipeline']")
        index = check_int(
            state,
            "next_index",
            path,
            0,
            min(self._len, MAX_POSITION),
            f"an index of the MapDataset of {self._len} elements, or its end"
            if self._len < INFINITE
            else "an index of the infinite MapDataset",
        )
        self._executor.seek(index)
        self._buf, self._pos, self._buf_start = [], 0, index

    def start_prefetch(self) -> None:
        if not self._closed:
            self._executor.start()

    def close(self) -> None:
        self._closed = True
        self._executor.close()

    def computed_dataset(self) -> MapDataset[Any]:
        return self._executor.ds

    def handed_out_to(self) -> int:
        return self._buf_start + self._pos

    def buffer_info(self) -> tuple[int, int]:
        buf, pos = self._buf, self._pos
        if isinstance(buf, Columns):
            ahead = buf.take(min(pos, len(buf)), len(buf))
            return len(ahead) + self._executor.in_flight(), ahead.nbytes
        rest = buf[pos:]
        return len(rest) + self._executor.in_flight(), nbytes(rest)

    def tuning(self) -> Tuning | None:
        return self._executor.tuning()

    def parallelism(self) -> Parallelism:
        """The threads or worker processes computing this reader's chunks."""
        return self._executor.parallelism()

    def __repr__(self) -> str:
        return f"PrefetchDatasetIterator(next_index={self._buf_start + self._pos})"


def check_identity(recorded: Any, identity: tuple[str, ...], path: str) -> None:
    """Raises `CheckpointError` naming the first entry where `recorded` (a state's
    "pipeline") differs from `identity` (this pipeline's)."""
    fix = (
        "rebuild the pipeline as it was when the state was taken (the same sources, seeds, "
        "slicing, repeats, batch sizes and stages in the same order; threads, workers, "
        "prefetching and the map and filter functions may change)"
    )
    if not isinstance(recorded, list) or not all(isinstance(e, str) for e in recorded):
        raise CheckpointError(
            f"{path} = {recorded!r} is invalid: it must be the list of strings get_state() "
            f"records; the state is corrupt or from an older version of chute; {fix}."
        )
    for i, (was, now) in enumerate(zip(recorded, identity)):
        if not same_params(was, now):  # older states give derived seeds alone
            raise CheckpointError(
                f"{path}[{i}] = {was!r} in the state, but this pipeline has {now!r} there: "
                f"the state was taken from a different MapDataset; {fix}."
            )
    n = min(len(recorded), len(identity))
    if len(recorded) > n:
        raise CheckpointError(
            f"{path}[{n}] = {recorded[n]!r} in the state, but this pipeline ends at {path}[{n - 1}]: "
            f"the state was taken from a pipeline with more stages; {fix}."
        )
    if len(identity) > n:
        raise CheckpointError(
            f"{path} ends at [{n - 1}] in the state, but this pipeline has {identity[n]!r} at "
            f"[{n}]: the state was taken from a pipeline with fewer stages; {fix}."
        )
