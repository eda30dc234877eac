"""The engine's observer hook: how a layer above the engine watches pipelines run.

The engine calls this module, never the debug layer (`_src/debug/instrument.py`, `_src/debug/stats.py`):
the debug layer depends on the engine, never the reverse. It implements a
`PipelineObserver` and `install`s it when it is first imported; `chute.config` loads it,
through the loader the `chute` package registers (`config.register_debug_layer`), when a
debug option is switched on (`py_debug_mode`, `py_dataset_visualization_output_dir`, or
`MultiprocessingOptions(enable_profiling=True)` for one pipeline).

When the engine asks (`observing()`: an observer is installed and `config.instrumented()`),
which it does once per iterator created, never per element:

- `iterator(ds, make)`: `IterDataset._iter` hands the making of each stage's iterator
  over (`make()` builds the engine's);
- `map_chain(ds)`: a `to_iter_dataset` reader reads an equivalent of its MapDataset (same
  elements, same fingerprint), in this process or, pickled, in `mp_prefetch`'s workers;
- `shard(ds)`: `mp_prefetch`'s workers read an equivalent of a stream's shard, and
  `stream_chain(ds)` of the stages moved above it.

In worker processes no option is set: unpickling the chains made by `map_chain` (or the
shards made by `shard`) imports the observer's module, which installs it. Each worker
calls `worker_start(leaves)` once (the chains and shards it computes),
and after every chunk the function it returned; what that returns travels back with the
chunk to the function `figures_merger(leaves)` returned in the main process.

With no observer installed (debug never switched on) none of this runs or is imported, and
creating an iterator costs the one check it always did.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from chute._src.core import config

if TYPE_CHECKING:
    from chute._src.core.dataset import IterDataset, MapDataset
    from chute._src.core.iterator import DatasetIterator


class PipelineObserver(abc.ABC):
    """What the engine lets an observer do; see the module docstring for when."""

    @abc.abstractmethod
    def iterator(
        self, ds: IterDataset[Any], make: Callable[[], DatasetIterator[Any]]
    ) -> DatasetIterator[Any]:
        """The iterator of stage `ds`: the one `make()` builds (the engine's, which reads
        its parents' iterators through this hook too), possibly wrapped. A wrapper must pass
        state, prefetch and close straight through."""

    @abc.abstractmethod
    def map_chain(self, ds: MapDataset[Any]) -> MapDataset[Any]:
        """What a reader reads instead of `ds`: same elements, same fingerprint, picklable
        (it may be sent to worker processes)."""

    def stream_chain(self, ds: MapDataset[Any]) -> MapDataset[Any]:
        """The same as `map_chain` for stages applied to a stream's elements where they
        are read, not by a reader (a shard's moved stages in a worker). The default:
        `map_chain(ds)`."""
        return self.map_chain(ds)

    def shard(self, ds: IterDataset[Any]) -> IterDataset[Any]:
        """What a worker reads instead of shard `ds` of a stream (`mp_prefetch`): the same
        elements and states, picklable. The default: `ds` itself."""
        return ds

    @abc.abstractmethod
    def worker_start(
        self, leaves: Sequence[MapDataset[Any] | IterDataset[Any]]
    ) -> Callable[[], list[Any]] | None:
        """Called once in a worker process with the chains and shards it computes (as
        `map_chain` and `shard` made them): the function it then calls after each chunk or
        shard request, whose (picklable) result goes back with it; None when there is
        nothing to send."""

    @abc.abstractmethod
    def figures_merger(
        self, leaves: Sequence[MapDataset[Any] | IterDataset[Any]]
    ) -> Callable[[list[Any]], None] | None:
        """Called once in the main process for the chains and shards sent to workers: the
        function given what a worker sent back with each result; None when nothing will
        come."""


_current: PipelineObserver | None = None


def install(observer: PipelineObserver | None) -> PipelineObserver | None:
    """Makes `observer` the process's observer (None: none); returns the one it replaces."""
    global _current
    previous, _current = _current, observer
    return previous


def current() -> PipelineObserver | None:
    """The installed observer, whether or not the options ask for observing now."""
    return _current


def observing() -> PipelineObserver | None:
    """The observer, when one is installed and the options ask for it for iterators created
    now (`config.instrumented()`); else None."""
    if _current is None:
        return None
    return _current if config.instrumented() else None
