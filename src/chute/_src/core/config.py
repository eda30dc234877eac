"""`chute.config`: process-wide options, named as in Grain.

- `py_debug_mode` (bool, default False): iterators created afterwards record per-stage
  statistics (`chute.stats(it)`) and print the execution summary to stderr: every
  `py_debug_summary_interval_s` seconds, and once when they end or are closed (not again
  if the last periodic print already showed the final figures). `chute.stats(it)` returns
  the figures and prints nothing. `MultiprocessingOptions(enable_profiling=True)` turns
  this on for one pipeline: the stages up to its `mp_prefetch`.
- `py_dataset_visualization_output_dir` (str or None, default None): iterators created
  afterwards print the pipeline graph with each stage's element spec when their first
  element is produced; "" prints to stderr, a directory writes `pipeline_graph.txt` and
  `pipeline_graph.svg` (a picture annotated with the stats) there.
- `py_debug_summary_interval_s` (float, default 60): how often debug mode prints.

Both modes cost nothing when off: the choice is made once, when an iterator is created.
Switching one on loads the debug layer, which installs itself as the engine's observer
(`_src/core/observe.py`); the engine never imports it: the `chute` package, above the
engine, registers how to load it (`register_debug_layer`), and this module calls that.

>>> import chute
>>> chute.config.update("py_debug_mode", False)
>>> chute.config.get("py_debug_mode")
False
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

_DEFAULTS: dict[str, Any] = {
    "py_debug_mode": False,
    "py_dataset_visualization_output_dir": None,
    "py_debug_summary_interval_s": 60.0,
}
_values: dict[str, Any] = dict(_DEFAULTS)
_here = threading.local()  # debug mode for this thread only: see `debug_mode_here`


@contextlib.contextmanager
def debug_mode_here() -> Iterator[None]:
    """`py_debug_mode` on in this thread while iterators are built (enable_profiling)."""
    _load_debug_layer()
    before = getattr(_here, "debug", False)
    _here.debug = True
    try:
        yield
    finally:
        _here.debug = before


def update(name: str, value: Any) -> None:
    """Sets option `name` (see the module docstring for the options)."""
    if name not in _DEFAULTS:
        raise KeyError(f"chute.config has no option {name!r}: the options are {sorted(_DEFAULTS)}.")
    if name == "py_debug_mode" and not isinstance(value, bool):
        raise TypeError(f"py_debug_mode={value!r} is invalid: pass True or False.")
    if (
        name == "py_dataset_visualization_output_dir"
        and value is not None
        and not isinstance(value, str)
    ):
        raise TypeError(
            f"py_dataset_visualization_output_dir={value!r} is invalid: pass a directory "
            'path, "" to print to stderr, or None to turn visualization off.'
        )
    if name == "py_debug_summary_interval_s" and (
        isinstance(value, bool) or not isinstance(value, int | float) or value <= 0
    ):
        raise ValueError(
            f"py_debug_summary_interval_s={value!r} is invalid: pass a number of seconds > 0."
        )
    if (name == "py_debug_mode" and value) or (
        name == "py_dataset_visualization_output_dir" and value is not None
    ):
        _load_debug_layer()
    _values[name] = value


_debug_layer_loader: Callable[[], None] | None = None


def register_debug_layer(load: Callable[[], None]) -> None:
    """`load()` imports the debug layer (the statistics and summary over the
    instrumentation, which installs its observer, `_src/core/observe.py`, when first
    imported). The `chute` package registers it when imported; a worker process gets the
    layer by unpickling what it observes."""
    global _debug_layer_loader
    _debug_layer_loader = load


def _load_debug_layer() -> None:
    if _debug_layer_loader is None:
        raise RuntimeError(
            "a debug option was switched on, but no debug layer is registered: the chute "
            "package registers it when imported (chute/__init__.py); import chute first"
        )
    _debug_layer_loader()


def get(name: str) -> Any:
    """The current value of option `name`."""
    if name not in _DEFAULTS:
        raise KeyError(f"chute.config has no option {name!r}: the options are {sorted(_DEFAULTS)}.")
    if name == "py_debug_mode" and getattr(_here, "debug", False):
        return True
    return _values[name]


def get_or_default(name: str) -> Any:
    """The current value of option `name`, as Grain's `config.get_or_default`.

    Grain reads its options from absl flags and falls back to a flag's default while the
    flags are unparsed; chute's options are not flags, so this is `get`.
    """
    return get(name)


def instrumented() -> bool:
    """True when new iterators must record statistics or the pipeline graph."""
    return (
        bool(_values["py_debug_mode"])
        or getattr(_here, "debug", False)
        or _values["py_dataset_visualization_output_dir"] is not None
        or _exports > 0
    )


_exports = 0  # metrics exports open (`chute.metrics.export`): they read the same figures


def exporting(delta: int) -> None:
    """A metrics export opens (+1) or closes (-1); while one is open, iterators created
    record the figures it sends (`_src/debug/metrics/export.py`)."""
    global _exports
    _exports += delta
