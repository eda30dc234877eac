"""`IterDataset.prefetch(n)`: what `ds.prefetch(...)` means to a tf.data or a Grain user.

tf.data's `ds.prefetch(tf.data.AUTOTUNE)` (or `prefetch(8)`) computes elements in the
background ahead of the consumer; Grain's older `IterDataset.prefetch(options)` starts
worker processes. `prefetch` accepts both habits: `MultiprocessingOptions` give
`mp_prefetch`; an int `n` gives `experimental.ThreadPrefetchIterDataset` with a buffer of
`n` elements (0: none); `chute.AUTOTUNE` gives the same with `AUTOTUNE_BUFFER` elements,
tf.data's usual outcome for a final `prefetch` (one element being consumed, one ready):
the thread overlaps the pipeline with the step. The size is not tuned at run time; give
an int for another. Anything else raises, naming both stages.
"""

from __future__ import annotations

from typing import Any, TypeVar

from chute._src.core.dataset import IterDataset
from chute._src.core.options import MultiprocessingOptions
from chute._src.exec.autotune import is_autotune

T = TypeVar("T")

AUTOTUNE_BUFFER = 2
"""The buffer of `prefetch(chute.AUTOTUNE)`, in elements."""


def prefetch(ds: IterDataset[T], buffer: Any) -> IterDataset[T]:
    """`ds` prefetched as `buffer` says (see the module's docstring).

    >>> import chute
    >>> ds = chute.MapDataset.range(4).to_iter_dataset().batch(2).prefetch(chute.AUTOTUNE)
    >>> [b.tolist() for b in ds]
    [[0, 1], [2, 3]]
    """
    if isinstance(buffer, MultiprocessingOptions):
        return ds.mp_prefetch(buffer)
    from chute._src.exec.thread_prefetch import ThreadPrefetchIterDataset

    if is_autotune(buffer):
        return ThreadPrefetchIterDataset(ds, prefetch_buffer_size=AUTOTUNE_BUFFER)
    if isinstance(buffer, int) and not isinstance(buffer, bool) and buffer >= 0:
        return ThreadPrefetchIterDataset(ds, prefetch_buffer_size=buffer)
    raise TypeError(
        f"IterDataset.prefetch({buffer!r}) is invalid: pass chute.AUTOTUNE or an int >= 0 "
        "(elements computed ahead in a background thread, as tf.data's prefetch: "
        "chute.experimental.ThreadPrefetchIterDataset), or MultiprocessingOptions (worker "
        "processes, as Grain's prefetch: ds.mp_prefetch(chute.MultiprocessingOptions(...)))."
    )
