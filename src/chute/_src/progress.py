"""`Progress`: a small progress bar (records, MB/s, ETA) that wraps an iterable.

It draws on stderr only when stderr is a terminal, unless `force=True`; a later
`chute.progress(iterable)` re-exports it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from types import TracebackType
from typing import Generic, TextIO, TypeVar

__all__ = ["Progress", "format_duration"]

T = TypeVar("T")


def format_duration(seconds: float) -> str:
    """`h:mm:ss` or `m:ss`.

    >>> format_duration(75), format_duration(3725)
    ('1:15', '1:02:05')
    """
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _count(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{int(n)}"


class Progress(Generic[T]):
    """Counts records (and bytes) as they go by, and draws a one-line status.

    Use it as an iterable wrapper, `for x in Progress(items): ...`, or as a context
    object with `update(n, nbytes)`. `nbytes` may be a function of each item, so
    wrapping an iterable of bytes shows MB/s. The line shows records done (of `total`,
    taken from `len(iterable)` when it has one), percent, records/s, MB/s and ETA.

    >>> import io
    >>> out = io.StringIO()
    >>> with Progress(total=4, desc="demo", file=out, force=True, interval=0) as p:
    ...     p.update(4, nbytes=2_000_000)
    >>> "demo: 4/4 records 100%" in out.getvalue()
    True
    >>> sum(Progress(range(5), file=io.StringIO()))
    10
    """

    def __init__(
        self,
        iterable: Iterable[T] | None = None,
        *,
        total: int | None = None,
        desc: str = "",
        unit: str = "records",
        nbytes: Callable[[T], int] | None = None,
        file: TextIO | None = None,
        force: bool | None = None,
        interval: float = 0.1,
    ) -> None:
        self._iterable = iterable
        if total is None and isinstance(iterable, Sized):
            total = len(iterable)
        self.total = total
        self.desc = desc
        self.unit = unit
        self._nbytes = nbytes
        self._file = file if file is not None else sys.stderr
        isatty = getattr(self._file, "isatty", lambda: False)
        self.enabled = bool(force) if force is not None else bool(isatty())
        self._interval = interval
        self.n = 0
        self.bytes = 0
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._width = 0
        self._closed = False

    def __iter__(self) -> Iterator[T]:
        if self._iterable is None:
            raise TypeError("Progress() without an iterable is not iterable; call update()")
        try:
            for item in self._iterable:
                yield item
                self.update(1, self._nbytes(item) if self._nbytes is not None else 0)
        finally:
            self.close()

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        """Adds `n` records and `nbytes` bytes; redraws at most every `interval` s."""
        self.n += n
        self.bytes += nbytes
        if self.enabled:
            now = time.perf_counter()
            if now - self._last_draw >= self._interval:
                self._last_draw = now
                self._draw(now)

    def line(self, now: float | None = None) -> str:
        """The status line, as it would be drawn now."""
        elapsed = max((now or time.perf_counter()) - self._start, 1e-9)
        parts = [f"{self.desc}: " if self.desc else ""]
        done = _count(self.n)
        if self.total is not None:
            pct = 100 * self.n / self.total if self.total else 100
            parts.append(f"{done}/{_count(self.total)} {self.unit} {pct:3.0f}%")
        else:
            parts.append(f"{done} {self.unit}")
        parts.append(f" | {_count(self.n / elapsed)} {self.unit}/s")
        if self.bytes:
            parts.append(f" | {self.bytes / elapsed / 1e6:.1f} MB/s")
        if self.total is not None and 0 < self.n < self.total:
            eta = (self.total - self.n) * elapsed / self.n
            parts.append(f" | ETA {format_duration(eta)}")
        else:
            parts.append(f" | {format_duration(elapsed)}")
        return "".join(parts)

    def _draw(self, now: float) -> None:
        text = self.line(now)
        pad = " " * max(0, self._width - len(text))
        self._width = len(text)
        self._file.write(f"\r{text}{pad}")
        self._file.flush()

    def close(self) -> None:
        """Draws the final line and ends it with a newline."""
        if self._closed:
            return
        self._closed = True
        if self.enabled:
            self._draw(time.perf_counter())
            self._file.write("\n")
            self._file.flush()

    def __enter__(self) -> Progress[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
