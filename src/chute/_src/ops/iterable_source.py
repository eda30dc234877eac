"""`IterDataset.source`: a stream from a Python iterable, a factory of iterators, or a
stateful object (an HF-style streaming dataset).

Two ways to resume, chosen by what the object offers:

- an object with `get_state()`/`set_state(state)` (or `state_dict()`/`load_state_dict()`,
  as Hugging Face's `IterableDataset` and torch's `Stateful`) resumes exactly: the state
  holds what the object returns, which must be JSON-serialisable. Every iterator starts
  where the object was when it was given (its state then is set again), and iterating it
  is `iter(obj)` after `set_state`; the object holds one position, so use one iterator of
  such a stream at a time;
- any other re-iterable object (a list, a file-list reader whose `__iter__` starts again)
  or a zero-argument function returning an iterator resumes by counting: the state is the
  number of elements handed out, and restoring creates a fresh iterator and skips that
  many. That is exact when the object gives the same elements each time it is iterated,
  and costs reading the skipped elements again.

A lone iterator (a generator object) can be read only once, so it is refused, naming the
fix: pass the function that creates it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from chute._src.core.contract import StageRole
from chute._src.core.dataset import IterDataset
from chute._src.core.errors import CheckpointError
from chute._src.core.iterator import DatasetIterator, check_int
from chute._src.core.transforms import describe

_STATE_METHODS = (("get_state", "set_state"), ("state_dict", "load_state_dict"))


def _state_methods(obj: object) -> tuple[str, str] | None:
    for get, put in _STATE_METHODS:
        if callable(getattr(obj, get, None)) and callable(getattr(obj, put, None)):
            return get, put
    return None


class IterableSourceIterDataset(IterDataset[Any]):
    """The elements of `source`: an iterable, a function returning an iterator, or an
    object with `get_state`/`set_state` (see the module doc for how each resumes).

    >>> import chute
    >>> ds = chute.IterDataset.source(lambda: iter(range(5))).map(lambda x: x * 10)
    >>> it = iter(ds)
    >>> next(it), next(it), it.get_state()  # doctest: +ELLIPSIS
    (0, 10, {'stage': 'map', 'parent': {'stage': 'source', 'count': 2}, 'checksum': '...'})
    >>> list(it)
    [20, 30, 40]
    """

    _role = StageRole.SOURCE

    def __init__(self, source: Iterable[Any] | Callable[[], Iterable[Any]]) -> None:
        super().__init__()
        methods = _state_methods(source)
        given: Any = source
        is_iterable = callable(getattr(source, "__iter__", None))
        if isinstance(source, str | bytes | bytearray | dict):
            raise TypeError(
                f"IterDataset.source: {type(source).__name__} {_short(source)} is not a "
                "stream of elements (iterating it gives its characters, bytes or keys): pass "
                "a list of elements, or a function that returns an iterator over them."
            )
        if methods is None and is_iterable and iter(given) is given:
            raise TypeError(
                f"IterDataset.source: {_short(source)} is an iterator, which can be read only "
                "once, so a pipeline over it could not restart nor resume from a state: pass "
                "the function that creates it instead, e.g. IterDataset.source(lambda: "
                "make_iterator()), or an object with get_state()/set_state()."
            )
        if methods is None and not is_iterable and not callable(source):
            raise TypeError(
                f"IterDataset.source: {_short(source)} of type {type(source).__name__} is "
                "neither iterable, nor a function returning an iterator, nor an object with "
                "get_state()/set_state(): pass one of those."
            )
        self._source: Any = source
        self._methods = methods
        self._iterable = is_iterable
        # Where a stateful object is now: every iterator of this stream starts there.
        self._initial: Any = getattr(source, methods[0])() if methods is not None else None

    def _make_iterator(self) -> DatasetIterator[Any]:
        if self._methods is not None:
            return _StatefulIterator(self)
        return _CountingIterator(self)

    def _open(self) -> Iterator[Any]:
        """A fresh iterator over the elements (for the counting and stateful kinds)."""
        made: Any = iter(self._source) if self._iterable else self._source()
        try:
            return iter(made)
        except TypeError:
            raise TypeError(
                f"IterDataset.source: the function {describe(self._source)} returned "
                f"{_short(made)} of type {type(made).__name__}, which is not iterable: it must "
                "return an iterator (a generator, iter(list), ...) each time it is called."
            ) from None

    def __repr__(self) -> str:
        kind = "stateful" if self._methods else "iterable" if self._iterable else "factory"
        return f"IterableSourceIterDataset({kind}: {_short(self._source)})"


def _short(obj: object) -> str:
    text = describe(obj) if callable(obj) and not hasattr(obj, "__iter__") else repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


class _CountingIterator(DatasetIterator[Any]):
    """Resumes by counting: the state is how many elements were handed out."""

    stage = "source"

    def __init__(self, ds: IterableSourceIterDataset) -> None:
        super().__init__()
        self._ds = ds
        self._it: Iterator[Any] | None = None
        self._count = 0

    def _iterator(self) -> Iterator[Any]:
        if self._it is None:
            self._it = self._ds._open()
        return self._it

    def __next__(self) -> Any:
        x = next(self._iterator())
        self._count += 1
        return x

    def _next_many(self, n: int) -> list[Any]:
        out = list(itertools.islice(self._iterator(), n))
        self._count += len(out)
        return out

    def own_state(self) -> dict[str, Any]:
        return {"count": self._count}

    def _count_at(self, state: Any) -> int | None:
        value = state.get("count") if isinstance(state, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        count = check_int(state, "count", path)
        it = self._ds._open()
        skipped = sum(1 for _ in itertools.islice(it, count))
        if skipped < count:
            raise CheckpointError(
                f"{path}['count'] = {count} is past the end of {self._ds!r}, which now gives "
                f"{skipped} elements: it gives other elements than when the state was taken "
                "(a source restored by counting must give the same elements each time); "
                "restore a state taken from this source."
            )
        self.close()
        self._it, self._count = it, count

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if callable(close):  # a generator: run its finally blocks now
            close()
        self._it = None


class _StatefulIterator(DatasetIterator[Any]):
    """Resumes exactly: the state is the object's own (`get_state()` or `state_dict()`)."""

    stage = "source"

    def __init__(self, ds: IterableSourceIterDataset) -> None:
        super().__init__()
        self._ds = ds
        self._obj: Any = ds._source
        assert ds._methods is not None
        self._get, self._put = ds._methods
        getattr(self._obj, self._put)(ds._initial)  # a fresh iterator starts at the start
        self._it: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self._it is None:
            self._it = self._ds._open()
        return next(self._it)

    def own_state(self) -> dict[str, Any]:
        return {"state": getattr(self._obj, self._get)()}

    def restore_own_state(self, state: dict[str, Any], path: str) -> None:
        try:
            getattr(self._obj, self._put)(state["state"])
        except Exception as e:
            raise CheckpointError(
                f"{path}['state']: {self._ds!r}.{self._put} rejected it "
                f"({type(e).__name__}: {e}); restore a state taken from this source."
            ) from e
        self._it = None  # a fresh iterator continues from the restored state
