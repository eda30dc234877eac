"""`DatasetIterator`: the stateful cursor over an `IterDataset`, and its checkpoint state.

A state is a plain JSON-serialisable dict shaped like the pipeline: each iterator stores
its stage name, its own few integers, and its parent's state under "parent". `set_state`
walks the same shape and rejects a state whose stages do not match, naming the path.

The state a user gets (`iter(ds).get_state()`, a `DataLoader`'s) carries a checksum of its
values (`state_checks.seal`); `set_state` checks it and the state's bounds (depth, string
lengths) before anything else, so a state edited after it was saved is rejected.

Every integer of a state is checked against what its stage can hold (`check_int`), and
against the position of the stage's parent where both say how many elements were handed
out (`_count_at`), before any replay starts; a state that is rejected, even by a check that
needs the data (a replay past the end), leaves the iterator where it was.

`iter(ds)` hands out the pipeline's top iterator inside a `ThreadGuardedIterator`: one
thread at a time may call `next` on it; a second thread calling at the same moment gets
a `RuntimeError` rather than duplicated or skipped elements.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from chute._src.core.checkpointing import from_state_dict, to_state_dict
from chute._src.core.errors import CheckpointError
from chute._src.core.exiting import park_if_abandoned
from chute._src.core.state_checks import CHECKSUM_KEY, clip_message, quote, seal, unseal

if TYPE_CHECKING:
    from chute._src.core.columns import Columns
    from chute._src.core.tuning import Parallelism, Tuning

T = TypeVar("T")

MAX_POSITION = (1 << 62) - 1
"""The largest count of elements a state may hold (146 years at a billion a second):
larger ones are corrupt, and would overflow the int64 index arithmetic downstream."""

_FIX = (
    "the state is corrupt or from a different pipeline; restore a state taken by get_state() "
    "of the same pipeline"
)


class DatasetIterator(Iterator[T], Generic[T], abc.ABC):
    """An iterator with `get_state()`/`set_state()`, `start_prefetch()` and `close()`.

    The protocol (docs/design.md, docs/extending.md): a subclass implements `__next__`, and
    gives the iterators it reads to `__init__` (none, one, or a list), which `children()`
    returns. Then state, `start_prefetch` and `close` work for it: its state is
    `{"stage": stage, **own_state(), "parent": ...}` ("parents": [...] for several), checked
    on restore. A subclass may instead override `get_state` and `set_state` with a state of
    any shape, as in Grain; it then restores its parents itself, if it has any.
    """

    stage: ClassVar[str] = "iterator"
    """The stage name recorded in the state; a state must match it to be restored."""

    transparent: ClassVar[bool] = False
    """True for the iterator of a stage that hands on its one parent's elements unchanged
    and only moves work elsewhere or does none (a `PREFETCH` or `PASS_THROUGH` stage:
    threads, worker processes, a seed): its state is its parent's, so a state restores into
    the pipeline with or without the stage. What it has computed ahead is never in a state;
    a prefetching iterator returns the state its parent had after the last element it
    handed out."""

    stage_params: str = ""
    """What of this stage's parameters fixes the positions of its output (a batch size, a
    seed), recorded as the state's "params" and checked on restore; set by
    `IterDataset` from the stage's `_fingerprint_params()`."""

    iterated: Any = None
    """The dataset (or `DataLoader`) whose `iter()` made this iterator, set there: what
    `chute.experimental.provenance` reads a live iterator's pipeline from."""

    _keeps_own_state: ClassVar[bool] = False
    """True for an iterator written as in Grain, overriding `set_state` with a state of its
    own shape (set once, when its class is made: `__init_subclass__`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "set_state" in cls.__dict__:
            cls._keeps_own_state = True

    bound_to_thread: bool = False
    """True when this iterator must be advanced on the thread that created it (its chunks
    come from worker processes through a channel that is not shared across threads)."""

    def __init__(
        self, parent: DatasetIterator[Any] | Sequence[DatasetIterator[Any]] | None = None
    ) -> None:
        if parent is None:
            children: tuple[DatasetIterator[Any], ...] = ()
        elif isinstance(parent, DatasetIterator):
            children = (parent,)
        else:
            children = tuple(parent)
        self._children = children
        # The single parent of most stages. Typed as present: only stages without one
        # (which never read it) have none.
        self._parent: DatasetIterator[Any] = cast(
            "DatasetIterator[Any]", children[0] if len(children) == 1 else None
        )

    def children(self) -> tuple[DatasetIterator[Any], ...]:
        """The iterators this one reads from (its parents', or the one it wraps)."""
        return self.__dict__.get("_children", ())

    def __iter__(self) -> DatasetIterator[T]:
        return self

    @abc.abstractmethod
    def __next__(self) -> T:
        """The next element; `StopIteration` at the end."""

    def _next_many(self, n: int) -> list[T]:
        """Up to `n` next elements (fewer only at the end). Stages override it for speed."""
        out: list[T] = []
        append = out.append
        try:
            for _ in range(n):
                append(self.__next__())
        except StopIteration:
            pass
        return out

    def _next_columns(self, n: int) -> list[T] | Columns:
        """Up to `n` next elements, as `_next_many` gives them, or as `Columns` (one array
        per leaf, `core/columns.py`) where this iterator holds them so: a reader fed by
        worker processes. What `batch` asks its parent for; a stage that hands its
        parent's elements on unchanged (a pass-through) forwards it."""
        return self._next_many(n)

    # -- checkpointing ---------------------------------------------------------------------

    def own_state(self) -> dict[str, Any]:
        """This stage's own state (not its parents'); stateless stages keep the default."""
        return {}

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        """Restores what `own_state` returned; `state` has been checked for its keys, and
        the parents are restored already. `path` names `state` in errors.

        Checks every value (`check_int`) before it changes anything."""

    def _count_at(self, state: Any) -> int | None:
        """How many elements this iterator had handed out when `state` was taken, where
        its stage knows that exactly (None elsewhere, and for a malformed `state`: the
        stage's own checks report it). Stages use it to check their counters against
        their parent's position."""
        if self.transparent:
            return self.children()[0]._count_at(state)
        return None

    def _catch_up(self, state: Any) -> Any:
        """`state`, handed out by this iterator earlier in this run and held since by a
        stage above (a window's start, a prefetched element's, an epoch's start), with the
        changes made between steps since then recorded in it (a mixture's new weights,
        `IterDataset.mix`), so that a replay from it makes each change where it was made.

        What the pipeline's top does with its state before handing it out, and what a
        stage does before it rewinds its parent to a state it holds (`repeat`, `cache`).
        A stage that records such changes overrides it; the default hands each child its
        part of `state` ("parent", "parents"; a state of another stage, as a transparent
        stage or a wrapper hands out its child's, goes to the one child whole). `state`
        itself is never changed: a changed part is a copy."""
        children = self.children()
        if not children or not isinstance(state, dict):
            return state
        if self._keeps_own_state:
            # A state of its own shape (docs/extending.md): either its parent's whole (a
            # wrapper's), or the parent's state is under a key of the user's. With several
            # parents, only the stage knows which is whose: it overrides this method.
            if len(children) != 1:
                return state
            new = children[0]._catch_up(state)
            return new if new is not state else _catch_up_inside(children[0], state)
        if len(children) == 1 and (self.transparent or state.get("stage") != self.stage):
            return children[0]._catch_up(state)
        if len(children) == 1:
            part = state.get("parent")
            new = children[0]._catch_up(part) if part is not None else None
            return state if new is part else {**state, "parent": new}
        parts = state.get("parents")
        if not isinstance(parts, list) or len(parts) != len(children):
            return state
        news = [c._catch_up(s) for c, s in zip(children, parts)]
        return state if all(a is b for a, b in zip(news, parts)) else {**state, "parents": news}

    def get_state(self) -> dict[str, Any]:
        """A small JSON-serialisable dict from which `set_state` continues exactly here."""
        children = self.children()
        if self.transparent:
            return children[0].get_state()
        state: dict[str, Any] = {"stage": self.stage, **self.own_state()}
        if self.stage_params:
            state["params"] = self.stage_params
        if len(children) == 1:
            state["parent"] = children[0].get_state()
        elif children:
            state["parents"] = [c.get_state() for c in children]
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from `state`, taken by `get_state` of an identical pipeline.

        Raises `CheckpointError` naming the path of a value that does not fit, or for a
        state changed after it was saved (its checksum); the iterator is then where it was
        before the call."""
        state = unseal(state)
        try:
            before: dict[str, Any] | None = self._catch_up(self.get_state())
        except Exception:  # a closed or failed iterator: nothing to return to
            before = None
        try:
            self._restore(state, "state")
        except CheckpointError as e:
            clip_message(e)
            if before is not None:
                try:
                    self._restore(before, "state")
                except Exception as again:
                    e.add_note(
                        f"chute: the iterator could not be returned to its previous state "
                        f"({type(again).__name__}: {again}); create a new one with iter(ds)."
                    )
            raise

    def _restore(self, state: Any, path: str) -> None:
        """Restores `state`, found at `path` of the pipeline's state: what a stage calls on
        its parents (`restore_child`)."""
        if self._keeps_own_state:
            # The stage keeps a state of its own shape (Grain's way): its own set_state.
            try:
                self.set_state(state)
            except CheckpointError as e:
                e.add_note(f"chute: restoring {path}")
                raise
            return
        children = self.children()
        if self.transparent:
            children[0]._restore(state, path)
            return
        own_keys = set(self.own_state())
        if self.stage_params:
            own_keys.add("params")
        links = {"parent"} if len(children) == 1 else {"parents"} if children else set()
        check_state(state, self.stage, {"stage", *own_keys} | links, path)
        if (
            self.stage_params
            and state["params"] != self.stage_params
            and not _same_params(state["params"], self.stage_params)
        ):
            raise CheckpointError(
                f"{path}['params'] = {quote(state['params'])}, but this pipeline's {self.stage!r} "
                f"stage there has {self.stage_params!r}: the state was taken from a pipeline "
                "built with other parameters, which put elements at other positions; rebuild "
                "the pipeline as it was when the state was taken (threads, workers, prefetching "
                "and the map and filter functions may change)."
            )
        # The parents first: their own values are checked before this stage compares its
        # counters with the parents' positions.
        if len(children) == 1:
            children[0]._restore(state["parent"], f"{path}['parent']")
        elif children:
            states = state["parents"]
            if not isinstance(states, list) or len(states) != len(children):
                raise CheckpointError(
                    f"{path}['parents'] is not a list of {len(children)} states: the state is "
                    f"from a {self.stage!r} stage of other inputs; restore a state of this "
                    "pipeline."
                )
            for i, (c, s) in enumerate(zip(children, states)):
                c._restore(s, f"{path}['parents'][{i}]")
        self.restore_own_state(state, path)

    def state_dict(self) -> dict[str, str]:
        """`get_state()` as JSON text under one key: torch's `Stateful` protocol, so
        `torch.distributed.checkpoint` and torchdata's `StatefulDataLoader` save an
        iterator as they are (docs/checkpointing.md). One string stores as it is in both,
        whatever the state's shape."""
        return to_state_dict(self.get_state())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continues from what `state_dict()` returned (`set_state` of its state)."""
        self.set_state(from_state_dict(state_dict))

    # -- lifecycle -------------------------------------------------------------------------

    def start_prefetch(self) -> None:
        """Starts background work (threads, workers) now, before the first `next`."""
        for c in self.children():
            c.start_prefetch()

    def close(self) -> None:
        """Stops background work and releases resources; idempotent."""
        for c in self.children():
            c.close()

    # -- what the debug layer reads ----------------------------------------------------------

    def computed_dataset(self) -> Any:
        """The MapDataset whose chunks this iterator computes (a `to_iter_dataset` reader),
        else None."""
        return None

    def buffer_info(self) -> tuple[int, int] | None:
        """(elements, bytes of numpy arrays) computed ahead of the consumer, for stages that
        compute ahead; None for the others."""
        return None

    def handed_out_to(self) -> int | None:
        """A reader's position in its computed dataset (`computed_dataset()`): the elements
        before it have been handed out (or passed over, filtered); None for other stages."""
        return None

    def tuning(self) -> Tuning | None:
        """What `chute.AUTOTUNE` chose for this stage's iterator so far, and why (a
        `Tuning`: its current values and its decisions); None when nothing is tuned."""
        return None

    def parallelism(self) -> Parallelism | None:
        """The threads or worker processes computing this stage's elements besides the
        consumer's thread (a reader, `mp_prefetch`); None for stages that compute on it."""
        return None

    def __enter__(self) -> DatasetIterator[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_USER_STATE_DEPTH = 4
"""How deep in a state of the user's own shape `_catch_up` looks for its parent's state."""


def _catch_up_inside(
    child: DatasetIterator[Any], state: Any, depth: int = _USER_STATE_DEPTH
) -> Any:
    """`state`, a user stage's state of any shape (docs/extending.md: the parent's state
    under any key), with each part of it that `child` brings up to date replaced by a copy
    (sealed again where the part was sealed: the parent's public `get_state` seals it). A
    part of the user's own shape (no `"stage"`) is looked inside, `depth` levels at most.
    `state` itself is never changed."""
    if depth <= 0 or not isinstance(state, dict | list):
        return state
    out: Any = None
    for k, part in list(state.items()) if isinstance(state, dict) else list(enumerate(state)):
        if isinstance(part, dict) and "stage" in part:
            new = child._catch_up(unseal(part) if CHECKSUM_KEY in part else part)
            new = part if new == part or (CHECKSUM_KEY in part and new == unseal(part)) else new
            if new is not part and CHECKSUM_KEY in part:
                new = seal(new)
        elif isinstance(part, dict | list):
            new = _catch_up_inside(child, part, depth - 1)
        else:
            continue
        if new is not part:
            if out is None:
                out = dict(state) if isinstance(state, dict) else list(state)
            out[k] = new
    return state if out is None else out


def walk_iterators(it: DatasetIterator[Any]) -> Iterator[DatasetIterator[Any]]:
    """`it` and every iterator below it, each once, through `children()`."""
    stack = [it]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(node.children()))


def check_state(state: Any, stage: str, keys: set[str], path: str) -> None:
    """Raises `CheckpointError` unless `state` is a dict for `stage` with exactly `keys`."""
    fix = (
        "restore a state taken by get_state() of the same pipeline, built the same way "
        "(threads, worker processes and prefetching may differ)"
    )
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path} is a {type(state).__name__}, not a dict: an iterator state is the dict "
            f"get_state() returns; {fix}."
        )
    if state.get("stage") != stage:
        raise CheckpointError(
            f"{path} is the state of a {quote(state.get('stage'))} stage, but this pipeline has a "
            f"{stage!r} stage there: the state is from a different pipeline; {fix}."
        )
    if set(state) != keys:
        raise CheckpointError(
            f"{path} has keys {quote(sorted(map(str, state)))}, expected {sorted(keys)} for a {stage!r} "
            f"stage: the state is corrupt or from another version; {fix}."
        )


def check_int(
    state: dict[str, Any],
    key: str,
    path: str,
    lo: int = 0,
    hi: int = MAX_POSITION,
    why: str = "",
) -> int:
    """`state[key]` as an int in `[lo, hi]`, or a `CheckpointError` naming the path.

    `why` says where the bound comes from (what the stage can hold)."""
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        because = f" ({why})" if why else ""
        raise CheckpointError(
            f"{path}[{key!r}] = {quote(value)} is invalid: it must be an int in [{lo}, {hi}]"
            f"{because}; {_FIX}."
        )
    return value


def bad_value(path: str, key: str, value: Any, rule: str) -> CheckpointError:
    """The error for `state[key]` that is an int in range but breaks `rule`."""
    return CheckpointError(f"{path}[{key!r}] = {quote(value)} is invalid: {rule}; {_FIX}.")


def int_at(state: Any, key: str) -> int | None:
    """`state[key]` when `state` is a dict holding a non-negative int there, else None
    (for `_count_at`, which reads states not yet checked)."""
    if not isinstance(state, dict):
        return None
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POSITION:
        return None
    return value


def _same_params(recorded: Any, now: str) -> bool:
    """Whether a state's "params" name this stage's parameters (also in the form states
    saved before seeds were shown as given take: `seeding.same_params`)."""
    from chute._src.core.seeding import same_params

    return same_params(recorded, now)


def concurrent_next_error(it: object) -> RuntimeError:
    return RuntimeError(
        f"next() was called on {it!r} from two threads at once: a chute iterator is used "
        "by one thread at a time (two threads sharing it would get duplicated and skipped "
        "elements). Create one iterator per thread (shard the dataset), or hold a "
        "threading.Lock around each next() call."
    )


class ThreadGuardedIterator(DatasetIterator[T]):
    """What `iter(ds)` returns: the pipeline's top iterator, for one thread at a time.

    Transparent otherwise: its state is the top iterator's, sealed with a checksum of its
    values (`state_checks.seal`; `set_state` checks it), and other attributes are the top
    iterator's. A call takes the one token from a list and puts it back after
    (`list.pop` and `list.append` are atomic), so the guard never makes a thread wait and
    costs two C calls per `next` (a `threading.Lock` costs several times more).
    """

    def __init__(self, inner: DatasetIterator[T]) -> None:
        super().__init__(inner)
        self._take, self._give = one_token()
        self._next = inner.__next__

    def __next__(self) -> T:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self._parent) from None
        try:
            return self._next()
        except StopIteration:
            raise
        except BaseException:
            park_if_abandoned()  # a daemon thread at interpreter exit: no traceback
            raise
        finally:
            self._give(None)

    def _next_many(self, n: int) -> list[T]:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self._parent) from None
        try:
            return self._parent._next_many(n)
        except StopIteration:
            raise
        except BaseException:
            park_if_abandoned()
            raise
        finally:
            self._give(None)

    def get_state(self) -> dict[str, Any]:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self._parent) from None
        try:
            top = self._parent
            return cast("dict[str, Any]", seal(top._catch_up(top.get_state())))
        finally:
            self._give(None)

    def set_state(self, state: dict[str, Any]) -> None:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self._parent) from None
        try:
            # Checked and unsealed here: a stage with a `set_state` of its own (Grain's
            # way) gets the state it returned, without the checksum.
            self._parent.set_state(unseal(state))
        except CheckpointError as e:
            raise clip_message(e) from None
        finally:
            self._give(None)

    def _restore(self, state: Any, path: str) -> None:
        self._parent._restore(state, path)

    # What DatasetIterator defines for the debug layer is the top iterator's too (these are
    # found on the class, so `__getattr__` would not pass them on).
    def computed_dataset(self) -> Any:
        return self._parent.computed_dataset()

    def buffer_info(self) -> tuple[int, int] | None:
        return self._parent.buffer_info()

    def handed_out_to(self) -> int | None:
        return self._parent.handed_out_to()

    def tuning(self) -> Tuning | None:
        return self._parent.tuning()

    def parallelism(self) -> Parallelism | None:
        return self._parent.parallelism()

    def __getattr__(self, name: str) -> Any:
        if name == "_parent":  # not yet set (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self._parent, name)

    def __repr__(self) -> str:
        return repr(self._parent)


def one_token() -> tuple[Callable[[], None], Callable[[None], None]]:
    """`(take, give)`: `take()` raises IndexError while the token is taken."""
    token: list[None] = [None]
    return token.pop, token.append
