"""`experimental.batch_and_pad`: a `batch_fn` that pads a short last batch instead of
dropping it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chute._src.core import tree


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
