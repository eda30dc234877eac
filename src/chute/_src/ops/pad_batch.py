"""Padded batches: the `batch_fn`s that pad.

`PadStack` (`batch(..., pad_value=..., padding_struct=...)`) stacks a list of
same-structured elements like `tree.stack`, but array leaves of different shapes are
padded, each axis to the longest in the batch, or the first axis to a fixed length given
in `padding_struct`. A leaf longer than its fixed length raises: nothing is cut silently.

`batch_and_pad` (`chute.experimental`, Grain's name) pads the other axis: a short last
batch gets rows of `pad_value` up to the batch size, instead of being dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chute._src.core import outbuf, tree


class PadStack:
    """A `batch_fn` that pads ragged array leaves before stacking them.

    >>> import numpy as np
    >>> PadStack(pad_value=-1)([np.array([1, 2]), np.array([3])])
    array([[ 1,  2],
           [ 3, -1]])
    >>> PadStack(padding_struct={"t": 4})([{"t": np.array([1])}, {"t": np.array([2, 3])}])
    {'t': array([[1, 0, 0, 0],
           [2, 3, 0, 0]])}
    """

    def __init__(self, pad_value: Any = None, padding_struct: Any = None) -> None:
        self._pad = pad_value
        self._lengths = padding_struct
        _check_lengths(padding_struct, "padding_struct")

    def __call__(self, elements: Sequence[Any]) -> Any:
        return self._stack(list(elements), self._lengths, self._pad, "element")

    def __repr__(self) -> str:
        return f"PadStack(pad_value={self._pad!r}, padding_struct={self._lengths!r})"

    def output_spec(self, input_spec: Any, batch_size: int, drop_remainder: bool) -> Any:
        """The spec of its batches (Grain's `BatchFn` protocol): a leading axis of
        `batch_size` (None unless `drop_remainder`); an array leaf's first axis is the
        fixed length of `padding_struct` where it gives one. Other axes are the input's
        (padding to the longest keeps a known length; an unknown one stays None)."""
        from chute._src.core.element_spec import ShapeDtypeStruct

        size = batch_size if drop_remainder else None
        return self._spec(input_spec, self._lengths, size, ShapeDtypeStruct)

    def _spec(self, spec: Any, length: Any, size: int | None, make: Any) -> Any:
        if isinstance(spec, dict):
            return type(spec)(
                (k, self._spec(v, _sub(length, k), size, make)) for k, v in spec.items()
            )
        if isinstance(spec, list | tuple) and not hasattr(spec, "_fields"):
            return type(spec)(
                self._spec(v, _sub(length, i), size, make) for i, v in enumerate(spec)
            )
        if spec is None:
            return None
        shape = tuple(spec.shape)
        if isinstance(length, int) and shape:
            shape = (length, *shape[1:])
        return make(shape=(size, *shape), dtype=spec.dtype)

    def _stack(self, elements: list[Any], length: Any, pad: Any, path: str) -> Any:
        first = elements[0]
        if isinstance(first, dict):
            return type(first)(
                (
                    k,
                    self._stack(
                        [e[k] for e in elements], _sub(length, k), _sub(pad, k), f"{path}[{k!r}]"
                    ),
                )
                for k in first
            )
        if isinstance(first, list | tuple) and not hasattr(first, "_fields"):
            return type(first)(
                self._stack([e[i] for e in elements], _sub(length, i), _sub(pad, i), f"{path}[{i}]")
                for i in range(len(first))
            )
        if isinstance(first, np.ndarray) and first.ndim > 0:
            return _pad_arrays(elements, length, pad, path)
        return tree.stack(elements)


def _sub(struct: Any, key: Any) -> Any:
    if isinstance(struct, Mapping):
        return struct.get(key)
    if isinstance(struct, list | tuple):
        return struct[key] if key < len(struct) else None
    return struct


def _check_lengths(struct: Any, name: str) -> None:
    for leaf in tree.leaves(struct):
        if leaf is not None and (isinstance(leaf, bool) or not isinstance(leaf, int) or leaf < 0):
            raise ValueError(
                f"batch: {name} has length {leaf!r}: lengths must be non-negative ints (or "
                'None to pad to the longest), e.g. padding_struct={"tokens": 128}.'
            )


def _pad_arrays(arrays: list[np.ndarray], length: Any, pad: Any, path: str) -> np.ndarray:
    shapes = [a.shape for a in arrays]
    ndim = arrays[0].ndim
    if any(len(s) != ndim for s in shapes):
        raise ValueError(
            f"batch: {path} has arrays of different ranks {sorted(set(shapes))}: padding "
            "makes lengths equal but cannot add axes; give every element the same rank."
        )
    target = [max(s[d] for s in shapes) for d in range(ndim)]
    if isinstance(length, int):
        longest = target[0]
        if longest > length:
            raise ValueError(
                f"batch: {path} has length {longest} > {length} from padding_struct: padding "
                "never cuts; cut longer elements before batching, or raise the length."
            )
        target[0] = length
    if all(s == tuple(target) for s in shapes):
        return outbuf.stack(arrays)
    out = outbuf.empty((len(arrays), *target), np.result_type(*arrays))
    out.fill(0 if pad is None else pad)
    for i, a in enumerate(arrays):
        index: tuple[int | slice, ...] = (i, *(slice(0, n) for n in a.shape))
        out[index] = a
    return out


def batch_fn_with_padding(batch_fn: Any, pad_value: Any, padding_struct: Any) -> Any:
    """`batch_fn`, or a `PadStack` when padding was asked for (not both)."""
    if pad_value is None and padding_struct is None:
        return batch_fn
    if batch_fn is not None:
        raise ValueError(
            "batch: batch_fn= and pad_value=/padding_struct= were both given: padding is a "
            "way of stacking, so pass one of them (pad inside your batch_fn if you need both)."
        )
    return PadStack(pad_value, padding_struct)


def batch_and_pad(values: Sequence[Any], *, batch_size: int, pad_value: Any = 0) -> Any:
    """`values` stacked leaf by leaf, then padded with `pad_value` to `batch_size` rows.

    >>> import functools, chute
    >>> fn = functools.partial(batch_and_pad, batch_size=3)
    >>> [b.tolist() for b in chute.MapDataset.range(1, 5).batch(3, batch_fn=fn)]
    [[1, 2, 3], [4, 0, 0]]
    """
    if not values:
        raise ValueError("batch_and_pad: values is empty: there is nothing to batch.")
    if len(values) > batch_size:
        raise ValueError(
            f"batch_and_pad: {len(values)} values do not fit a batch of {batch_size}: pass "
            "batch_size at least the number of values (the batch size of the stage)."
        )
    batch = tree.stack(list(values))
    missing = batch_size - len(values)
    if missing == 0:
        return batch

    def pad(leaf: Any) -> Any:
        leaf = np.asarray(leaf)
        fill = np.full((missing, *leaf.shape[1:]), pad_value, dtype=leaf.dtype)
        return np.concatenate([leaf, fill])

    return tree.map_leaves(pad, batch)
