"""Execution options."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How `to_iter_dataset` computes elements in one process.

    num_threads: threads computing elements in parallel, in index order; 0 computes them in
      the consuming thread. Threads help when the work releases the GIL (I/O, numpy,
      tokenizers, decoding); work that holds the GIL wants worker processes instead.
    prefetch_buffer_size: how many elements may be computed ahead of the consumer.
    """

    num_threads: int = 16
    prefetch_buffer_size: int = 500

    def __post_init__(self) -> None:
        for name in ("num_threads", "prefetch_buffer_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"ReadOptions: {name}={value!r} is invalid: it must be an int >= 0; "
                    f"e.g. ReadOptions({name}=4)."
                )
        if self.num_threads > 0 and self.prefetch_buffer_size == 0:
            raise ValueError(
                f"ReadOptions: num_threads={self.num_threads} with prefetch_buffer_size=0 "
                "is invalid: threads need room to compute ahead; set prefetch_buffer_size "
                ">= num_threads, or num_threads=0."
            )


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
    """How `IterDataset.mp_prefetch` uses worker processes.

    num_workers: worker processes computing elements; 0 computes in this process. The
      output is the same for every value.
    per_worker_buffer_size: chunks of elements each worker may compute ahead.
    enable_profiling: accepted for Grain compatibility; see `chute.stats` instead.
    """

    num_workers: int = 0
    per_worker_buffer_size: int = 2
    enable_profiling: bool = False

    def __post_init__(self) -> None:
        for name, low in (("num_workers", 0), ("per_worker_buffer_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"MultiprocessingOptions: {name}={value!r} is invalid: it must be an int "
                    f">= {low}; e.g. MultiprocessingOptions(num_workers=2)."
                )
