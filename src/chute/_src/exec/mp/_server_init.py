"""Imported first by the forkserver chute starts, and by each worker as it starts:
prepares the process that workers are forked from without running any of the user's code.

- `apply_thread_defaults`: native thread pools of one thread each (`WORKER_THREAD_ENV`),
  where the user's environment leaves them unset, set in this process's own environment
  before numpy is imported. Workers are the parallelism, so a BLAS pool per worker only
  oversubscribes the cores, and OpenBLAS's threads spin for ~0.1 s of CPU after
  `import numpy`. Setting them here, never in the user's process, means no other thread
  of the user's process ever sees them in the environment it passes to its subprocesses.
- In the forkserver only: imports numpy, the worker's module and the modules named by
  `MODULE_PREFIX` entries of the server's preload list (those unpickling the workers'
  tasks imports: chute's stages, the user's modules), once for every worker forked from
  it. A module that fails to import here is left to the workers, which import it
  themselves and report the failure. The entries ride in the preload list itself (which
  the server's command line carries): the server's own loop tries to import each entry
  too, and an entry with the prefix is no module name, so that try fails quietly.

Standard library only until the thread counts are set.
"""

from __future__ import annotations

import os
import re
import sys

# Native thread pools a worker runs with, unless the user's environment says otherwise.
WORKER_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# A preload entry naming a module for this module to import (robustly) in the server.
MODULE_PREFIX = "chute-import:"
_ENTRY = re.compile(re.escape(MODULE_PREFIX) + r"([A-Za-z_][A-Za-z0-9_.]*)")


def apply_thread_defaults() -> None:
    """Sets each `WORKER_THREAD_ENV` variable this process's environment lacks to "1"."""
    for name in WORKER_THREAD_ENV:
        os.environ.setdefault(name, "1")


def in_forkserver() -> bool:
    """Whether this process is multiprocessing's forkserver (started with `python -c` and
    its `main` function)."""
    return any("multiprocessing.forkserver import main" in a for a in sys.orig_argv)


def named_modules() -> list[str]:
    """The modules the server's preload list names with `MODULE_PREFIX`, in order."""
    command = " ".join(sys.orig_argv)
    return list(dict.fromkeys(_ENTRY.findall(command)))


def _import(name: str) -> None:
    import importlib

    try:
        importlib.import_module(name)
    except BaseException:
        pass  # left to the workers, which import it and report what fails


def _prepare_server() -> None:
    apply_thread_defaults()
    for name in ("numpy", "chute._src.exec.mp._worker", *named_modules()):
        _import(name)


if in_forkserver():
    _prepare_server()
