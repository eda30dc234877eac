"""`DatasetIterator`: the stateful cursor over an `IterDataset`, and its checkpoint state.

A state is a plain JSON-serialisable dict shaped like the pipeline: each iterator stores
its stage name, its own few integers, and its parent's state under "parent". `set_state`
walks the same shape and rejects a state whose stages do not match, naming the path.

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
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, ClassVar, Generic, TypeVar, cast

from chute._src.errors import CheckpointError

T = TypeVar("T")

MAX_POSITION = (1 << 62) - 1
"""The largest count of elements a state may hold (146 years at a billion a second):
larger ones are corrupt, and would overflow the int64 index arithmetic downstream."""

_FIX = (
    "the state is corrupt or from a different pipeline; restore a state taken by get_state() "
    "of the same pipeline"
)


class DatasetIterator(Iterator[T], Generic[T], abc.ABC):
    """An iterator with `get_state()`/`set_state()`, `start_prefetch()` and `close()`."""

    stage: ClassVar[str] = "iterator"
    """The stage name recorded in the state; a state must match it to be restored."""

    def __init__(self, parent: DatasetIterator[Any] | None = None) -> None:
        # Typed as present: only leaf iterators (which never read it) have none.
        self._parent: DatasetIterator[Any] = cast("DatasetIterator[Any]", parent)

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

    # -- checkpointing ---------------------------------------------------------------------

    def _own_state(self) -> dict[str, Any]:
        """This stage's own state (not its parent's); stateless stages keep the default."""
        return {}

    def _restore_own_state(self, state: dict[str, Any], path: str) -> None:
        """Restores what `_own_state` returned; `state` has been checked for its keys.

        Checks every value (`check_int`) before it changes anything."""

    def _count_at(self, state: Any) -> int | None:
        """How many elements this iterator had handed out when `state` was taken, where
        its stage knows that exactly (None elsewhere, and for a malformed `state`: the
        stage's own checks report it). Stages use it to check their counters against
        their parent's position."""
        return None

    def get_state(self) -> dict[str, Any]:
        """A small JSON-serialisable dict from which `set_state` continues exactly here."""
        state: dict[str, Any] = {"stage": self.stage, **self._own_state()}
        if self._parent is not None:
            state["parent"] = self._parent.get_state()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from `state`, taken by `get_state` of an identical pipeline.

        Raises `CheckpointError` naming the path of a value that does not fit; the iterator
        is then where it was before the call."""
        try:
            before: dict[str, Any] | None = self.get_state()
        except Exception:  # a closed or failed iterator: nothing to return to
            before = None
        try:
            self._restore(state, "state")
        except CheckpointError as e:
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
        own_keys = set(self._own_state())
        expected = {"stage", *own_keys} | ({"parent"} if self._parent is not None else set())
        check_state(state, self.stage, expected, path)
        # The parent first: its own values are checked before this stage compares its
        # counters with the parent's position.
        if self._parent is not None:
            self._parent._restore(state["parent"], f"{path}['parent']")
        self._restore_own_state(state, path)

    # -- lifecycle -------------------------------------------------------------------------

    def start_prefetch(self) -> None:
        """Starts background work (threads, workers) now, before the first `next`."""
        if self._parent is not None:
            self._parent.start_prefetch()

    def close(self) -> None:
        """Stops background work and releases resources; idempotent."""
        if self._parent is not None:
            self._parent.close()

    def __enter__(self) -> DatasetIterator[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def check_state(state: Any, stage: str, keys: set[str], path: str) -> None:
    """Raises `CheckpointError` unless `state` is a dict for `stage` with exactly `keys`."""
    fix = (
        "restore a state taken by get_state() of the same pipeline, built the same way "
        "(the number of threads and workers may differ)"
    )
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{path} is a {type(state).__name__}, not a dict: an iterator state is the dict "
            f"get_state() returns; {fix}."
        )
    if state.get("stage") != stage:
        raise CheckpointError(
            f"{path} is the state of a {state.get('stage')!r} stage, but this pipeline has a "
            f"{stage!r} stage there: the state is from a different pipeline; {fix}."
        )
    if set(state) != keys:
        raise CheckpointError(
            f"{path} has keys {sorted(state)}, expected {sorted(keys)} for a {stage!r} "
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
            f"{path}[{key!r}] = {value!r} is invalid: it must be an int in [{lo}, {hi}]"
            f"{because}; {_FIX}."
        )
    return value


def bad_value(path: str, key: str, value: Any, rule: str) -> CheckpointError:
    """The error for `state[key]` that is an int in range but breaks `rule`."""
    return CheckpointError(f"{path}[{key!r}] = {value!r} is invalid: {rule}; {_FIX}.")


def int_at(state: Any, key: str) -> int | None:
    """`state[key]` when `state` is a dict holding a non-negative int there, else None
    (for `_count_at`, which reads states not yet checked)."""
    if not isinstance(state, dict):
        return None
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POSITION:
        return None
    return value


def child_iterators(it: Any) -> list[DatasetIterator[Any]]:
    """The iterators `it` holds directly: its parents, or the iterator it wraps."""
    found: list[DatasetIterator[Any]] = []
    for v in vars(it).values():
        if isinstance(v, DatasetIterator):
            found.append(v)
        elif isinstance(v, list | tuple):
            found.extend(x for x in v if isinstance(x, DatasetIterator))
    return found


def concurrent_next_error(it: object) -> RuntimeError:
    return RuntimeError(
        f"next() was called on {it!r} from two threads at once: a chute iterator is used "
        "by one thread at a time (two threads sharing it would get duplicated and skipped "
        "elements). Create one iterator per thread (shard the dataset), or hold a "
        "threading.Lock around each next() call."
    )


class ThreadGuardedIterator(DatasetIterator[T]):
    """What `iter(ds)` returns: the pipeline's top iterator, for one thread at a time.

    Transparent otherwise: its state is the top iterator's, and other attributes are the
    top iterator's. A call takes the one token from a list and puts it back after
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
        finally:
            self._give(None)

    def _next_many(self, n: int) -> list[T]:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self._parent) from None
        try:
            return self._parent._next_many(n)
        finally:
            self._give(None)

    def get_state(self) -> dict[str, Any]:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self._parent) from None
        try:
            return self._parent.get_state()
        finally:
            self._give(None)

    def set_state(self, state: dict[str, Any]) -> None:
        try:
            self._take()
        except IndexError:
            raise concurrent_next_error(self._parent) from None
        try:
            self._parent.set_state(state)
        finally:
            self._give(None)

    def _restore(self, state: Any, path: str) -> None:
        self._parent._restore(state, path)

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
