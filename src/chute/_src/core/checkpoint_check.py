"""`assert_equal_output_after_checkpoint`: the restore-at-every-step check all stages use."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np


def assert_trees_equal(actual: Any, expected: Any, where: str = "element") -> None:
    """Asserts two nested structures are equal, arrays by value, dtype and shape."""
    if isinstance(expected, np.ndarray) or isinstance(actual, np.ndarray):
        a, e = np.asarray(actual), np.asarray(expected)
        if a.dtype != e.dtype or a.shape != e.shape or not np.array_equal(a, e):
            raise AssertionError(f"{where}: {actual!r} != {expected!r}")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise AssertionError(f"{where}: {actual!r} != {expected!r}")
        for k in expected:
            assert_trees_equal(actual[k], expected[k], f"{where}[{k!r}]")
        return
    if isinstance(expected, list | tuple):
        if type(actual) is not type(expected) or len(actual) != len(expected):
            raise AssertionError(f"{where}: {actual!r} != {expected!r}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_trees_equal(a, e, f"{where}[{i}]")
        return
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        assert_trees_equal(dataclasses.asdict(actual), dataclasses.asdict(expected), where)
        return
    if actual != expected or type(actual) is not type(expected):
        raise AssertionError(f"{where}: {actual!r} != {expected!r}")


def state_spec(state: Any) -> Any:
    """The shape of a state, as Grain's checker compares it: the same nesting, with each
    leaf replaced by its type and each list of one type of leaf by its type and length."""
    if isinstance(state, dict):
        return {k: state_spec(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        first = state[0] if state else None
        leaves = state and not isinstance(first, dict | list | tuple)
        if leaves and all(type(x) is type(first) for x in state):
            return f"{type(state).__name__}<{type(first).__name__}>[{len(state)}]"
        return [state_spec(x) for x in state]
    return type(state).__name__


def _check_spec(spec: Any, state: Any, k: int) -> None:
    now = state_spec(state)
    if now != spec:
        raise AssertionError(
            f"the state's shape changed at step {k}: {now!r}, was {spec!r} at step 0 "
            f"(a state keeps one shape for the whole run: store what varies in fixed fields)"
        )


def _take(it: Iterator[Any], n: int) -> list[Any]:
    return list(itertools.islice(it, n))


def assert_equal_output_after_checkpoint(
    ds: Iterable[Any],
    *,
    restore_into: Iterable[Any] | None = None,
    max_elements: int = 200,
    steps: Iterable[int] | None = None,
    same_shape: bool = True,
) -> None:
    """Checks that restoring a checkpoint continues the stream element for element.

    Iterates `ds` once for reference (at most `max_elements`). Then, at every step `k`
    (or those in `steps`), takes `get_state()`, sends it through JSON, restores it into a
    fresh iterator of `restore_into` (default: `ds` again; pass the same pipeline built with
    other thread or worker counts to check those too) and checks that what follows equals
    the reference from `k` on, including where the stream ends. As Grain's checker does, it
    also checks that the state keeps its shape from step to step (the same keys, leaf types
    and list lengths) and that `get_state()` right after `set_state(s)` gives `s` back.
    Finally it restores an early state into an iterator that has run to the end, which must
    rewind it. `same_shape=False` leaves out the shape check, for a pipeline whose state
    changes shape by design (an interleave of inputs of different kinds).

    >>> import chute
    >>> ds = chute.MapDataset.range(20).shuffle(seed=0).repeat(2).batch(3)
    >>> assert_equal_output_after_checkpoint(ds)
    """
    target = restore_into if restore_into is not None else ds
    it = iter(ds)
    # `ds` may be an iterator itself (an ElasticIterator, `iter(loader)`), which `iter`
    # gives back as it is: it is rewound to its first state after the reference pass.
    initial = json.loads(json.dumps(it.get_state()))  # type: ignore[attr-defined]
    reference = _take(it, max_elements)
    exhausted = len(reference) < max_elements
    n = len(reference)
    wanted = set(range(n + 1)) if steps is None else {k for k in steps if 0 <= k <= n}
    again_it = iter(ds)
    if again_it is it:
        it.set_state(initial)  # type: ignore[attr-defined]
    it = again_it
    early_state: dict[str, Any] | None = None
    spec: Any = None
    try:
        for k in range(n + 1):
            if k in wanted:
                state = json.loads(json.dumps(it.get_state()))  # type: ignore[attr-defined]
                if spec is None:
                    spec = state_spec(state)
                elif same_shape:
                    _check_spec(spec, state, k)
                if early_state is None:
                    early_state = state
                fresh = iter(target)
                shared = fresh is it  # an iterator given as `ds`: put back at step k after
                try:
                    fresh.set_state(state)  # type: ignore[attr-defined]
                    again = json.loads(json.dumps(fresh.get_state()))  # type: ignore[attr-defined]
                    if again != state:
                        raise AssertionError(
                            f"get_state() right after set_state(s) at step {k} is not s: "
                            f"{again!r} != {state!r}"
                        )
                    rest = _take(fresh, n - k + (1 if exhausted else 0))
                finally:
                    if shared:
                        it.set_state(state)  # type: ignore[attr-defined]
                    else:
                        _close(fresh)
                if exhausted and len(rest) > n - k:
                    raise AssertionError(
                        f"after restoring at step {k}: the stream went on past its end "
                        f"(element {n} = {rest[-1]!r})"
                    )
                if len(rest) != n - k:
                    raise AssertionError(
                        f"after restoring at step {k}: got {len(rest)} more elements, "
                        f"expected {n - k}"
                    )
                for j, (a, e) in enumerate(zip(rest, reference[k:])):
                    assert_trees_equal(a, e, f"element {k + j} after restoring at step {k}")
            if k < n:
                assert_trees_equal(next(it), reference[k], f"element {k} of a second iteration")
        if early_state is not None:
            it.set_state(early_state)  # type: ignore[attr-defined]
            first = _take(it, 1)
            start = min(wanted)
            if reference[start : start + 1]:
                assert_trees_equal(first[0], reference[start], f"element {start} after rewinding")
    finally:
        _close(it)


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()
