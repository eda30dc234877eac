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
import functools
import hashlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar, cast

from chute._src.core import element_spec
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every stage class's `__init__` records the arguments it was called with, so that
        `_with_parents` can build the stage again on other parents."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not hasattr(init, "_records_arguments"):
            cls.__init__ = _recording_arguments(init)  # type: ignore[method-assign]

    def __init__(self, parents: _Node | Sequence[_Node] = ()) -> None:
        if type(self)._unimplemented is not None:
            raise self._unimplemented_error()
        self.__dict__.setdefault("_init_args", ((parents,), {}))
        # One dataset may be given alone, as in Grain: `super().__init__(parents=ds)`.
        self._parents: tuple[_Node, ...] = (
            (parents,) if isinstance(parents, _Node) else tuple(parents)
        )
        # Set while `_with_parents` builds this stage again (until its `__init__` returns):
        # what a stage derives from upstream, its seeds, is read from the stage it replaces.
        origin: _Node | None = self.__dict__.get("_rebuilt_from")
        if origin is not None:
            # Built again on other parents (`_with_parents`): the same seeds and the same
            # identity as the stage it replaces, wherever the new parents sit.
            self._pipeline_seed: int | None = origin._pipeline_seed
            self._depth: int = origin._depth
            self._fingerprint_memo: str | None = origin._fingerprint_memo
            self._identity_memo: tuple[str, ...] | None = origin._identity_memo
            return
        # The seed set upstream (`ds.seed(s)`); under several seeded parents (a mix), one
        # derived from all of them, in order, as in Grain.
        seeds = [p._pipeline_seed for p in self._parents if p._pipeline_seed is not None]
        self._pipeline_seed = (
            None if not seeds else seeds[0] if len(seeds) == 1 else derive_seed(*seeds)
        )
        self._depth = 1 + max((p._depth for p in self._parents), default=-1)
        self._fingerprint_memo = None
        self._identity_memo = None

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

    _keeps_element_spec: bool = False
    """True for a stage whose elements are its first parent's (a filter, shuffle, slice,
    repeat, mix, ...): its element spec is that parent's (`core/element_spec.py`)."""

    @property
    def _element_spec(self) -> Any:
        """Grain's element-spec inference: the shapes and dtypes of the elements, found
        from the stages without reading (`core/element_spec.py`); raises as Grain's does
        where this stage cannot infer them."""
        return element_spec.inferred(self)

    @property
    def parents(self) -> tuple[_Node, ...]:
        """The nodes this one reads from, in order."""
        return self._parents

    def _with_parents(self, parents: Sequence[_Node]) -> Self:
        """This stage reading from `parents` instead: equivalent nodes (the same elements),
        such as the pipeline rewritten for worker processes or wrapped for timing. Every
        rewrite of a pipeline goes through here.

        The stage is built again: its class called with the arguments it was made with,
        each old parent among them replaced by its new one, so that whatever `__init__`
        derives from the parents (a length, a spec) is derived from the new ones. The new
        stage keeps this one's seeds and identity (a rewrite changes where elements are
        computed, never which). A stage whose `__init__` makes its parents itself, rather
        than taking them as arguments, is copied with its parents swapped instead."""
        if len(parents) != len(self._parents):
            raise ValueError(
                f"{self!r}: with_parents got {len(parents)} parents, but the stage has "
                f"{len(self._parents)}: give one replacement for each of node.parents."
            )
        self._fingerprint  # noqa: B018 (computed here, with the identity: the new one keeps them)
        replace = {id(old): new for old, new in zip(self._parents, parents)}
        args, kwargs = self.__dict__.get("_init_args", ((), {}))
        if _mentions(args, kwargs, replace):
            new = type(self).__new__(type(self))
            new.__dict__["_rebuilt_from"] = self
            try:
                new.__init__(  # type: ignore[misc]
                    *_swap(args, replace), **{k: _swap(v, replace) for k, v in kwargs.items()}
                )
            finally:
                new.__dict__.pop("_rebuilt_from", None)
            if len(new._parents) == len(parents) and all(
                a is b for a, b in zip(new._parents, parents)
            ):
                return new
        new = copy.copy(self)
        new._parents = tuple(parents)
        return new

    def _origins(self, position: int, tracer: Any) -> list[Any]:
        """Where this stage's element at `position` came from (`core/provenance.py`): a
        list of `Origin`s in its parents (for a source: the record). The default, by role:
        element-wise and prefetching stages hand on the position, a node without parents
        is a source read by position; others raise, naming what to declare."""
        from chute._src.core.provenance import default_origins

        return default_origins(self, position, tracer)

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
            if name not in ("_parents", "_fingerprint_memo", "_identity_memo", "_init_args"):
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


def _recording_arguments(init: Callable[..., None]) -> Callable[..., None]:
    """`init` that first records its arguments on the stage (the outermost class's call:
    the one a rebuild repeats)."""

    @functools.wraps(init)
    def __init__(self: _Node, *args: Any, **kwargs: Any) -> None:
        self.__dict__.setdefault("_init_args", (args, kwargs))
        init(self, *args, **kwargs)

    __init__._records_arguments = True  # type: ignore[attr-defined]
    return __init__


def _swap(value: Any, replace: dict[int, _Node]) -> Any:
    """`value` with each old parent in it (itself, or in a list, tuple or dict) replaced."""
    if id(value) in replace:
        return replace[id(value)]
    if type(value) in (list, tuple):
        return type(value)(_swap(v, replace) for v in value)
    if type(value) is dict:
        return {k: _swap(v, replace) for k, v in value.items()}
    return value


def _mentions(args: tuple[Any, ...], kwargs: dict[str, Any], replace: dict[int, _Node]) -> bool:
    """Whether the recorded arguments hold the parents (so a rebuild can place new ones)."""
    found: set[int] = set()

    def visit(value: Any) -> None:
        if id(value) in replace:
            found.add(id(value))
        elif type(value) in (list, tuple):
            for v in value:
                visit(v)
        elif type(value) is dict:
            for v in value.values():
                visit(v)

    for v in (*args, *kwargs.values()):
        visit(v)
    return len(found) == len(replace)


def walk(ds: N, stop: Callable[[N], bool] | None = None) -> list[N]:
    """Every stage of `ds`'s graph once, each after all of its parents (sources first);
    below a stage for which `stop(stage)` is true, nothing.
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
        if stop is None or not stop(node):
            stack.extend((cast(N, p), False) for p in reversed(node.parents) if id(p) not in seen)
    return order


def rewrite(ds: N, fn: Callable[[N], N], stop: Callable[[N], bool] | None = None) -> N:
    """`ds` with `fn` applied to every node, sources first, each node once: `fn` receives
    the node already rebuilt (`with_parents`) on its rewritten parents, when they changed.
    A node for which `stop(node)` is true is handed to `fn` as it is, its parents unvisited:
    `fn` replaces it with all that is below it.
    The one rewrite of a pipeline: every part of chute that changes stages goes through it."""
    memo: dict[int, N] = {}
    stopped: set[int] = set()

    def halt(node: N) -> bool:
        if stop is not None and stop(node):
            stopped.add(id(node))
            return True
        return False

    for node in walk(ds, halt):
        if id(node) in stopped:
            memo[id(node)] = fn(node)
            continue
        parents = [memo[id(p)] for p in node.parents]
        rebuilt = (
            node._with_parents(parents)
            if any(a is not b for a, b in zip(parents, node.parents))
            else node
        )
        memo[id(node)] = fn(rebuilt)
    return memo[id(ds)]
