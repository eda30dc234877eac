"""The stage contract: what the engine reads from a dataset node, written as types.

The engine (worker processes, readers, the disk cache, checkpoints) and the debug layer
never ask for a stage's class or read its fields: they call the functions of this module,
which read what each node declares. What a node declares sits on it under private names,
out of the way of the user operations on `MapDataset` and `IterDataset` (`map`,
`batch`, ...):

- every node (`Node`): its parents (`parents`, public as in Grain), its role
  (`_role`), whether the engine inserted it (`_internal`) or it reads shards
  (`_reads_shards`), whether it computes on other threads or processes (`_concurrent`),
  how it is rebuilt on other parents (`_with_parents`), how worker processes receive it
  (`_for_workers`), what decides its elements (`_cache_identity`) and their positions
  (`_fingerprint_params`, and the pipeline's `_identity` and `_fingerprint`), where the
  element at a position came from (`_origins`, for `provenance`);
- by role, what that role promises on top (`ElementWise`, `Reader`, `Source`), checked
  where the engine relies on it, with an error naming the stage and what it lacks.

The roles (`StageRole`):

- `SOURCE`: reads data; has no parents. One that reads a user's source object shows it
  as `data_source` (what such an object may declare to the engine: `core/in_flight.py`).
- `READER`: `to_iter_dataset`, reading its one MapDataset parent in index order. Its
  `_with_executor(factory)` is the same stage with its chunks computed by another
  `ChunkExecutor` (`exec/executors.py`), and `_hands_out_nones` says whether filtered
  elements come out as None (then the stages above it must see them).
- `ELEMENT_WISE`: each output depends on one input alone, whatever its position (`map`,
  `filter`): `_as_map_stage(parent)` is the equivalent MapDataset stage on `parent`, so
  `mp_prefetch` can move it into the workers, and `_stage_name` is the name its iterator
  records in states (the stand-in left in its place records the same).
- `PREFETCH`: hands on its input unchanged, computed ahead elsewhere (threads, processes).
- `PASS_THROUGH`: hands on its input unchanged and does no work of its own (a seed, a
  stage with prefetching turned off, a stand-in for a stage moved into the workers). The
  debug summary never names these as the bottleneck.
- `ORDER_DEPENDENT`: everything else (batch, packing, mixing, user stages): what it
  produces depends on the order of its input. The default.

`reads_shards` is True for a stage (an interleave) whose parents are the shards of one
stream, each read whole and on its own, and merged by the stage's own rule: `mp_prefetch`
replaces each such parent (`with_parents`) by one fed by a worker process.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from chute._src.core.iter_dataset import IterDataset
    from chute._src.core.map_dataset import MapDataset


class StageRole(enum.Enum):
    SOURCE = "source"
    READER = "reader"
    ELEMENT_WISE = "element_wise"
    PREFETCH = "prefetch"
    PASS_THROUGH = "pass_through"
    ORDER_DEPENDENT = "order_dependent"


@runtime_checkable
class Node(Protocol):
    """What the engine reads from every node (`core/node.py` gives the defaults)."""

    @property
    def parents(self) -> Sequence[Any]: ...

    _role: StageRole
    _internal: bool
    _reads_shards: bool

    @property
    def _concurrent(self) -> bool: ...

    def _with_parents(self, parents: Sequence[Any]) -> Any: ...

    def _for_workers(self, resources: list[Any]) -> Any: ...

    def _cache_identity(self) -> dict[str, Any]: ...

    def _fingerprint_params(self) -> str: ...

    def _origins(self, position: int, tracer: Any) -> list[Any]: ...

    @property
    def _identity(self) -> tuple[str, ...]: ...

    @property
    def _fingerprint(self) -> str: ...


@runtime_checkable
class ElementWise(Node, Protocol):
    """An `ELEMENT_WISE` stage (an IterDataset)."""

    _stage_name: str

    def _as_map_stage(self, parent: MapDataset[Any]) -> MapDataset[Any]: ...


@runtime_checkable
class Reader(Node, Protocol):
    """A `READER` stage (`to_iter_dataset`)."""

    _hands_out_nones: bool

    def _with_executor(self, executor_factory: Callable[[], Any]) -> IterDataset[Any]: ...


N = TypeVar("N")


def role(node: Any) -> StageRole:
    """What `node` is to the engine."""
    value: StageRole = node._role
    return value


def is_internal(node: Any) -> bool:
    """Whether the engine put `node` in the pipeline, not the user (the summary hides it)."""
    return bool(node._internal)


def reads_shards(node: Any) -> bool:
    """Whether `node`'s parents are the shards of one stream, merged by its own rule."""
    return bool(node._reads_shards)


def is_concurrent(node: Any) -> bool:
    """Whether `node` computes its inputs on other threads or processes."""
    return bool(node._concurrent)


def with_parents(node: N, parents: Sequence[Any]) -> N:
    """`node` reading from `parents` instead: the same elements from equivalent parents."""
    rebuilt: N = node._with_parents(parents)  # type: ignore[attr-defined]
    return rebuilt


def for_workers(node: N, resources: list[Any]) -> N:
    """`node` as worker processes receive it (its parents already rewritten); what must be
    released afterwards (`unlink()`) is appended to `resources`."""
    shipped: N = node._for_workers(resources)  # type: ignore[attr-defined]
    return shipped


def cache_identity(node: Any) -> dict[str, Any]:
    """What, besides its parents, decides `node`'s elements (the disk cache's key)."""
    identity: dict[str, Any] = node._cache_identity()
    return identity


def position_params(node: Any) -> str:
    """What of `node`'s parameters fixes where its elements are, as its state records it."""
    return str(node._fingerprint_params())


def origins(node: Any, position: int, tracer: Any) -> list[Any]:
    """Where `node`'s element at `position` came from: `Origin`s in its parents, or for a
    source its record (`core/provenance.py`)."""
    found: list[Any] = node._origins(position, tracer)
    return found


def identity(node: Any) -> tuple[str, ...]:
    """The stages that fix the positions of `node`'s elements, which a state records."""
    entries: tuple[str, ...] = node._identity
    return entries


def fingerprint(node: Any) -> str:
    """A short hash of `identity(node)`."""
    return str(node._fingerprint)


def element_wise(node: Any) -> ElementWise:
    """`node` as an `ELEMENT_WISE` stage; TypeError naming what it lacks if it is not one."""
    if not isinstance(node, ElementWise):
        missing = [n for n in ("_stage_name", "_as_map_stage") if not hasattr(node, n)]
        raise TypeError(
            f"{node!r} declares the role ELEMENT_WISE but lacks {', '.join(missing)}: an "
            "element-wise stage names what its iterator records in states (_stage_name) and "
            "gives its MapDataset equivalent (_as_map_stage(parent)); or leave its role "
            "ORDER_DEPENDENT (the default), which is always correct."
        )
    return node


def reader(node: Any) -> Reader:
    """`node` as a `READER` stage; TypeError naming what it lacks if it is not one."""
    if not isinstance(node, Reader):
        raise TypeError(
            f"{node!r} declares the role READER but lacks _hands_out_nones or "
            "_with_executor: only to_iter_dataset's reader has that role."
        )
    return node


def source_object(node: Any) -> object | None:
    """The user's source object a `SOURCE` node reads, if it reads one."""
    source: object | None = node._data_source
    return source


__all__ = [
    "ElementWise",
    "Node",
    "Reader",
    "StageRole",
    "cache_identity",
    "element_wise",
    "fingerprint",
    "for_workers",
    "identity",
    "is_concurrent",
    "origins",
    "is_internal",
    "position_params",
    "reader",
    "reads_shards",
    "role",
    "source_object",
    "with_parents",
]
