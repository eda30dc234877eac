"""Per-stage metrics sent to a callback while pipelines run: `export(callback)`.

The figures are the debug summary's (`PipelineStats`: per stage the elements produced,
elements/s, own time, the share of the consumer's waiting, CPU share, buffer occupancy),
recorded by the same instrumentation and reached through the same door: the engine's
observer hook (`_src/core/observe.py`), opened while an export is (`config.exporting`). No
export open: nothing here is imported and iterators are built as they always are.

How it runs: iterators created while exports are open are timed as in debug mode (no GIL
sampler and nothing printed unless `py_debug_mode` is on too). The outermost iterator's
view (`ExportingView`, the summary's view plus the exports) is ticked on the consumer's
thread every 64 elements; when an export's interval has passed it computes the figures
and calls the export's callback there, and once more when the iterator ends or is closed.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from types import TracebackType

from chute._src.core import config
from chute._src.debug.instrument import TimedIterator, attach_view
from chute._src.debug.stats import PipelineStats, PipelineView

__all__ = ["Export", "ExportingView", "export"]

Callback = Callable[[PipelineStats], object]

_lock = threading.Lock()
_open: list[Export] = []


class Export:
    """An open export (what `export` returns): its callback gets the figures of iterators
    created while it is open, every `interval_s` seconds and when they end. `close()` (or
    leaving its `with` block) stops it."""

    def __init__(self, callback: Callback, interval_s: float) -> None:
        self.callback = callback
        self.interval_s = interval_s
        self.closed = False

    def close(self) -> None:
        """Stops the export: no call after this one returns (iterators created later are
        not instrumented for it)."""
        with _lock:
            if self.closed:
                return
            self.closed = True
            _open.remove(self)
            config.exporting(-1)

    def __enter__(self) -> Export:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"Export({self.callback!r}, interval_s={self.interval_s}, {state})"


def export(callback: Callback, *, interval_s: float = 10.0) -> Export:
    """Sends the per-stage figures of every iterator created from now on to `callback`.

    `callback(stats)` gets a `chute.PipelineStats` (what `chute.stats(it)` returns and
    the debug summary prints) every `interval_s` seconds while an iterator runs, checked
    every 64 elements on the consumer's thread, and once when it ends or is closed. It
    runs on that thread: keep it short (hand the figures to a thread of yours for slow
    sinks); an exception it raises comes out of `next()` (and that iterator calls it no
    more). Iterators are timed as in
    debug mode while an export is open (a few hundred nanoseconds per element and
    stage); close the export to stop: iterators created afterwards pay nothing.

    >>> import chute, chute.metrics
    >>> seen = []
    >>> with chute.metrics.export(seen.append, interval_s=60):
    ...     it = iter(chute.MapDataset.range(100).map(lambda x: x * 2).to_iter_dataset())
    ...     total = sum(it)
    >>> [s.elements for s in seen[-1].stages]
    [100, 100, 100]
    """
    if not callable(callback):
        raise TypeError(
            f"chute.metrics.export: callback={callback!r} is not callable; give a function "
            "taking a chute.PipelineStats, e.g. chute.metrics.PrometheusExporter()"
        )
    if not (isinstance(interval_s, int | float) and math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(
            f"chute.metrics.export: interval_s={interval_s!r} is invalid; give a number of "
            "seconds > 0 (the figures are sent at most that often, and when an iterator ends)"
        )
    e = Export(callback, float(interval_s))
    with _lock:
        _open.append(e)
        config.exporting(+1)
    return e


class ExportingView(PipelineView):
    """The summary's view of one iterator, which also sends its figures to the exports
    open when the iterator was created."""

    def __init__(self, top: TimedIterator) -> None:
        super().__init__(top)
        with _lock:
            self._exports = list(_open)
        now = time.monotonic()
        self._due = [now + e.interval_s for e in self._exports]
        self._ended = False

    def tick(self) -> None:
        super().tick()
        if not self._exports:
            return
        now = time.monotonic()
        due = [i for i, at in enumerate(self._due) if now >= at]
        if due:
            self._send(due)
            for i in due:
                self._due[i] = now + self._exports[i].interval_s

    def finished(self) -> None:
        super().finished()
        if not self._ended:
            self._ended = True
            self._send(range(len(self._exports)))

    def _send(self, which: range | list[int]) -> None:
        targets = [self._exports[i] for i in which if not self._exports[i].closed]
        if targets:
            figures = self.stats()
            for e in targets:
                try:
                    e.callback(figures)
                except BaseException:
                    # Raised once, out of next(); this iterator calls it no more.
                    i = self._exports.index(e)
                    del self._exports[i], self._due[i]
                    raise


attach_view(ExportingView)  # replaces the summary's view: the same, plus the exports
