"""`chute.progress(iterable)`: a progress bar (count, rate, MB/s, ETA) around any iterable.

Where it draws:

- in a terminal: on stderr, redrawn in place with `\\r`, cut to the terminal's width;
- in a Jupyter notebook (an IPython kernel is running): on stdout, which notebooks render
  in place on `\\r` as well;
- anywhere else (a log file, a pipe, CI): nowhere, unless `force=True`. `force=False`
  turns it off everywhere.

`chute convert` and `chute verify` draw theirs with the same class.

It is a user's tool, not the debug layer's (it watches an iterable, not a pipeline's
stages, and imports nothing of chute), so it sits on the lowest floor, where the
conversion tools (`_src/storage/convert/`), the command line and the public API all
import it.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from types import TracebackType
from typing import Generic, TextIO, TypeVar

__all__ = ["Progress", "format_duration", "in_notebook", "progress"]

T = TypeVar("T")

_BLOCKS = " ▏▎▍▌▋▊▉█"


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
    if n < 10 and n != int(n):
        return f"{n:.2f}"
    return f"{int(n)}"


def _bar(fraction: float, width: int) -> str:
    """A bar `width` characters wide, filled to `fraction` in eighths of a character.

    >>> _bar(0.5, 4), _bar(1.0, 4), _bar(0.0, 2)
    ('██  ', '████', '  ')
    """
    eighths = int(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_BLOCKS[part] if part and full < width else "")
    return text.ljust(width)


def in_notebook() -> bool:
    """Whether this process is an IPython kernel (Jupyter, Colab), not a terminal IPython."""
    if "ipykernel" not in sys.modules:
        return False
    get_ipython = getattr(sys.modules.get("IPython"), "get_ipython", None)
    shell = get_ipython() if get_ipython is not None else None
    return shell is not None and hasattr(shell, "kernel")


class Progress(Generic[T]):
    """Counts items (and bytes) as they go by, and draws a one-line status.

    Use it as an iterable wrapper, `for x in Progress(items): ...`, or as a context
    object with `update(n, nbytes)`. `nbytes` may be a function of each item, so
    wrapping an iterable of bytes shows MB/s. With a `total` (taken from `len(iterable)`
    when it has one) the line shows percent, a bar, done/total, rate and ETA; without
    one, the count, rate and elapsed time.

    >>> import io
    >>> out = io.StringIO()
    >>> with Progress(total=4, desc="demo", file=out, force=True, interval=0) as p:
    ...     p.update(4, nbytes=2_000_000)
    >>> "demo: 4/4 records 100%|" in out.getvalue()
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
        if total is not None and total < 0:
            raise ValueError(f"progress: total={total} is negative; give a count >= 0 or None")
        self._iterable = iterable
        if total is None and isinstance(iterable, Sized):
            total = len(iterable)
        self.total = total
        self.desc = desc
        self.unit = unit
        self._nbytes = nbytes
        notebook = file is None and in_notebook()
        if file is None:
            file = sys.stdout if notebook else sys.stderr
        self._file: TextIO = file
        isatty = getattr(self._file, "isatty", lambda: False)
        self._tty = bool(isatty())
        self.enabled = bool(force) if force is not None else (self._tty or notebook)
        self._interval = interval
        self.n = 0
        self.bytes = 0
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._width = 0
        self._closed = False

    def __iter__(self) -> Iterator[T]:
        if self._iterable is None:
            raise TypeError(
                "Progress() without an iterable is not iterable: call update(n) as work "
                "gets done, or wrap one, Progress(iterable)"
            )
        try:
            for item in self._iterable:
                yield item
                self.update(1, self._nbytes(item) if self._nbytes is not None else 0)
        finally:
            self.close()

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        """Adds `n` items and `nbytes` bytes; redraws at most every `interval` s."""
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
        head = f"{self.desc}: " if self.desc else ""
        rate = f"{_count(self.n / elapsed)} {self.unit}/s"
        if self.bytes:
            rate += f", {self.bytes / elapsed / 1e6:.1f} MB/s"
        if self.total is None:
            return f"{head}{_count(self.n)} {self.unit} [{format_duration(elapsed)}, {rate}]"
        fraction = self.n / self.total if self.total else 1.0
        times = format_duration(elapsed)
        if 0 < self.n < self.total:
            times += f"<{format_duration((self.total - self.n) * elapsed / self.n)}"
        return (
            f"{head}{_count(self.n)}/{_count(self.total)} {self.unit} "
            f"{100 * fraction:3.0f}%|{_bar(fraction, 20)}| [{times}, {rate}]"
        )

    def _draw(self, now: float) -> None:
        text = self.line(now)
        if self._tty:  # a line longer than the terminal wraps, and `\r` cannot undo that
            text = text[: max(20, shutil.get_terminal_size().columns - 1)]
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


def progress(
    iterable: Iterable[T],
    total: int | None = None,
    desc: str = "",
    *,
    unit: str = "elements",
    file: TextIO | None = None,
    force: bool | None = None,
    interval: float = 0.1,
    nbytes: Callable[[T], int] | None = None,
) -> Progress[T]:
    """Wraps `iterable` in a progress bar: `for batch in chute.progress(it, desc="train")`.

    It draws in a terminal (stderr) and in a notebook (stdout); elsewhere, as in a log,
    nothing, unless `force=True`. `total` defaults to `len(iterable)` where there is one.

    >>> import io, chute
    >>> out = io.StringIO()
    >>> for batch in chute.progress(range(3), desc="demo", file=out, force=True):
    ...     pass
    >>> out.getvalue().splitlines()[-1].split("[")[0].strip()
    'demo: 3/3 elements 100%|████████████████████|'
    >>> list(chute.progress(range(3), file=io.StringIO()))  # not a terminal: draws nothing
    [0, 1, 2]
    """
    if not isinstance(iterable, Iterable) and not hasattr(iterable, "__getitem__"):
        raise TypeError(
            f"chute.progress: {iterable!r} is not iterable; wrap a dataset, an iterator "
            "or any other iterable"
        )
    return Progress(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        nbytes=nbytes,
        file=file,
        force=force,
        interval=interval,
    )
