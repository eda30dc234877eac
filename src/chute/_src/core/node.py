"""What `MapDataset` and `IterDataset` share: the node (parents, a role, a rebuild with
other parents, the pipeline seed, identity and fingerprint), and the one walk and the one
rewrite of a pipeline's graph that every part of chute uses (`walk`, `rewrite`).

Both dataset types are lazy descriptions of a pipeline: building one computes nothing. A
`MapDataset` node answers `_getitems(indices)` for a whole numpy block of indices at once,
so index arithmetic (shuffle, slice, repeat, batch) costs a few numpy calls per block, not
a Python call per element. Indices past `len(ds)` address later epochs: every node reads
index `i` as position `i % len` of epoch `i // len`, which is how `repeat` gives each epoch
its own shuffle and its own random draws. An `IterDataset` yields a `DatasetIterator`,
which owns all mutable state.
"""

from __future__ import annotations

import abc
import copy
import hashlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar, cast

from chute._src.core.contract import StageRole
from chute._src.core.seeding import derive_seed, validate_seed

INFINITE = sys.maxsize
"""The length of an infinitely repeated `MapDataset`, as in Grain."""

# Tags that keep the seeds of different kinds of stage apart.
SEED_TAG_SHUFFLE = 1
SEED_TAG_RANDOM_MAP = 2


class _Node(abc.ABC):  # noqa: B024 (its abstract methods are the core types')
    """What `MapDataset` and `IterDataset` share: the node protocol (parents, a role, how to
    rebuild with other parents), the pipeline seed, a fingerprint."""

    _role: StageRole = StageRole.ORDER_DEPENDENT
    """What this stage is to the engine (`_src/core/contract.py`); a class or instance attribute."""

    _internal: bool = False
    """True for a stage the engine put in the pipeline, not the user (a stand-in for a
    stage moved into worker processes): the debug summary does not show it."""

    _reads_shards: bool = False
    """True for a stage whose parents are the shards of one stream, each read whole, from
    its start or a saved state, on its own, and merged by this stage's own rule
    (`InterleaveIterDataset`): `mp_prefetch` then reads each shard in a worker process."""

    _data_source: object | None = None
    """For a `SOURCE` node that reads a user's source object: that object."""

    _unimplemented: str | None = None
    """The method a subclass must still implement (set for each class by the dataset
    types' `__init_subclass__`); such a class cannot be instantiated, as an abstract one."""

    def __init__(self, parents: _Node | Sequence[_Node] = ()) -> None:
        if type(self)._unimplemented is not None:
            raise self._unimplemented_error()
        # One dataset may be given alone, as in Grain: `super().__init__(parents=ds)`.
        self._parents: tuple[_Node, ...] = (
            (parents,) if isinstance(parents, _Node) else tuple(parents)
        )
        # The seed set upstream (`ds.seed(s)`); under several seeded parents (a mix), one
        # derived from all of them, in order, as in Grain.
        seeds = [p._pipeline_seed for p in self._parents if p._pipeline_seed is not None]
        self._pipeline_seed: int | None = (
            None if not seeds else seeds[0] if len(seeds) == 1 else derive_seed(*seeds)
        )
        self._depth: int = 1 + max((p._depth for p in self._parents), default=-1)
        self._fingerprint_memo: str | None = None
        self._identity_memo: tuple[str, ...] | None = None

    def _unimplemented_error(self) -> TypeError:
        """The error for a class missing the method its dataset type needs."""
        missing = type(self)._unimplemented
        return TypeError(
            f"Can't instantiate abstract class {type(self).__name__} without an "
            f"implementation for abstract method {missing!r}: a MapDataset subclass "
            "implements __len__ and __getitem__(index) (or _getitems(indices)); an "
            "IterDataset subclass implements __iter__ (or _make_iterator) returning a "
            "DatasetIterator."
        )

    @property
    def parents(self) -> tuple[_Node, ...]:
        """The nodes this one reads from, in order."""
        return self._parents

    def _with_parents(self, parents: Sequence[_Node]) -> Self:
        """This stage reading from `parents` instead: equivalent nodes (the same elements),
        such as a copy rewritten for worker processes or wrapped for timing. Every rewrite
        of a pipeline goes through here. The copy keeps this stage's parameters, its seed
        and its identity; a stage that derives more from its parents in `__init__` than
        these overrides it."""
        if len(parents) != len(self._parents):
            raise ValueError(
                f"{self!r}: with_parents got {len(parents)} parents, but the stage has "
                f"{len(self._parents)}: give one replacement for each of node.parents."
            )
        self._fingerprint  # noqa: B018 (computed here, with the identity: the copy keeps them)
        new = copy.copy(self)
        new._parents = tuple(parents)
        return new

    @property
    def _concurrent(self) -> bool:
        """True when this stage computes its inputs on other threads or processes."""
        return False

    def _for_workers(self, resources: list[Any]) -> Self:
        """This node as worker processes should receive it (parents already rewritten).

        A source holding a large in-memory list returns a copy that shares it through
        shared memory, appending what must be released (`unlink()`) to `resources`."""
        return self

    def _op_seed(self, seed: int | None, tag: int, where: str) -> int:
        """The seed of a random stage: its own, or one derived from the pipeline seed.

        The derivation is keyed by the stage's depth in the pipeline, so two random stages
        of one pipeline draw independent streams from one `ds.seed(...)`.
        """
        if seed is not None:
            return derive_seed(validate_seed(seed, where), tag)
        if self._pipeline_seed is None:
            raise ValueError(
                f"{where} has no seed: {where} is random and chute's randomness is always "
                f"seeded; pass {where}(..., seed=42), or set a seed for the whole pipeline "
                "before it with ds.seed(42)."
            )
        return derive_seed(self._pipeline_seed, tag, self._depth)

    def _fingerprint_params(self) -> str:
        """What of this stage's parameters fixes where its elements are (sizes, seeds,
        slicing, batch sizes), as checkpoints record it: never file paths, thread or worker
        counts, nor a user's function (a state restores after a map function is fixed)."""
        return ""

    def _cache_identity(self) -> dict[str, Any]:
        """What, besides its parents, decides this stage's elements: named values that
        `IterDataset.cache(path)` hashes into its key, with the stage's type and the same of
        every parent. A function counts by its code, a source by what its `repr` says
        (files: their names), an options object, dict or set by its type only (thread and
        worker counts, memo tables: they never change the elements).

        The default describes the node by its own attributes (all but its parents and its
        cached fingerprint) and its fingerprint parameters. A stage overrides it to leave
        out what does not change its elements, or to add what its attributes do not show
        (a version, a setting read from elsewhere)."""
        identity: dict[str, Any] = {"(fingerprint params)": self._fingerprint_params()}
        for name, value in vars(self).items():
            if name not in ("_parents", "_fingerprint_memo", "_identity_memo"):
                identity[name] = value
        return identity

    @property
    def _identity(self) -> tuple[str, ...]:
        """What fixes the positions of this node's elements, which a state records: one
        `"Kind(params)"` per stage, sources first, with `" <- [i, j]"` naming the entries it
        reads where that is not just the entry before. Stages that hand on their input
        unchanged (`PASS_THROUGH`: seeds, timing wrappers) are left out."""
        if self._identity_memo is None:
            entries: list[str] = []
            index: dict[int, int] = {}
            for node in walk(self):
                inputs = [index[id(p)] for p in node._parents]
                if node._role is StageRole.PASS_THROUGH and len(inputs) == 1:
                    index[id(node)] = inputs[0]
                    continue
                name = type(node).__name__
                for suffix in ("MapDataset", "IterDataset"):
                    if name.endswith(suffix) and name != suffix:
                        name = name[: -len(suffix)]
                entry = f"{name}({node._fingerprint_params()})"
                if inputs != ([len(entries) - 1] if entries else []):
                    entry += f" <- {inputs}"
                entries.append(entry)
                index[id(node)] = len(entries) - 1
            self._identity_memo = tuple(entries)
        return self._identity_memo

    @property
    def _fingerprint(self) -> str:
        """A short hash of `identity`."""
        if self._fingerprint_memo is None:
            h = hashlib.blake2b(digest_size=8)
            h.update("\n".join(self._identity).encode())
            self._fingerprint_memo = h.hexdigest()
        return self._fingerprint_memo


N = TypeVar("N", bound=_Node)


def walk(ds: N) -> list[N]:
    """Every stage of `ds`'s graph once, each after all of its parents (sources first).
    The one walk of a pipeline: every part of chute that visits stages goes through it."""
    order: list[N] = []
    seen: set[int] = set()
    stack: list[tuple[N, bool]] = [(ds, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((cast(N, p), False) for p in reversed(node.parents) if id(p) not in seen)
    return order


def rewrite(ds: N, fn: Callable[[N], N]) -> N:
    """`ds` with `fn` applied to every node, sources first, each node once: `fn` receives
    the node already rebuilt (`with_parents`) on its rewritten parents, when they changed.
    The one rewrite of a pipeline: every part of chute that changes stages goes through it."""
    memo: dict[int, N] = {}
    for node in walk(ds):
        parents = [memo[id(p)] for p in node.parents]
        rebuilt = (
            node._with_parents(parents)
            if any(a is not b for a, b in zip(parents, node.parents))
            else node
        )
        memo[id(node)] = fn(rebuilt)
    return memo[id(ds)]
