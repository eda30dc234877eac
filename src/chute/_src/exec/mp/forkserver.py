"""The forkserver chute's worker processes are forked from, and how they are prepared.

`ensure_forkserver` starts the server (it imports numpy, chute's worker module and the
modules a pool's tasks need, once, so that workers forked from it find them imported),
`prewarm` starts it ahead of the first pool, `forkserver_cold` and
`forkserver_starting_s` say whether a pool still waits for it, and
`preparation_without_main` keeps the main script out of what multiprocessing tells the
workers to prepare. The pool (`pool.py`) starts its workers through these.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import threading
import time
from collections.abc import Callable, Iterable

from chute._src.exec.mp import _server_init
from chute._src.exec.mp._worker import WORKER_NAME_PREFIX

__all__ = [
    "DEFAULT_START_METHOD",
    "FORKSERVER_PRELOAD",
    "ensure_forkserver",
    "forkserver_cold",
    "forkserver_starting_s",
    "mark_served",
    "preparation_without_main",
    "prewarm",
]

# forkserver: workers are forked from a clean single-threaded server process, so a parent
# with threads (JAX, gRPC, a prefetch thread) is safe, and starting a worker costs a fork,
# not a fresh interpreter. `fork` is faster still but can deadlock a child when the
# parent has threads holding locks; `spawn` re-imports everything in every worker.
DEFAULT_START_METHOD = "forkserver"

# Imported by the forkserver chute starts, after what the preload list already names
# (`__main__` is taken out of it: see `ensure_forkserver`). `_server_init` sets the
# workers' native thread counts, then imports numpy, the worker's module and the modules
# named with its prefix.
FORKSERVER_PRELOAD = ("chute._src.exec.mp._server_init",)


def ensure_forkserver(modules: Iterable[str] = ()) -> None:
    """Starts the forkserver unless it runs. A server started here imports numpy, chute's
    worker module and `modules` once, so that workers forked from it find them imported;
    it never imports the main script (see `preparation_without_main`)."""
    global _forkserver_asked_at
    if _forkserver_asked_at is None:
        _forkserver_asked_at = time.monotonic()
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if server is None or _forkserver_running():
        multiprocessing.forkserver.ensure_running()
        return
    # `__main__` in the preload list asks the server to run the main script (Python 3.11
    # never does, looking its path up under the wrong key; later versions may): chute's
    # server runs nothing of the user's.
    current = [m for m in getattr(server, "_preload_modules", []) if m != "__main__"]
    extra = [m for m in FORKSERVER_PRELOAD if m not in current]
    named = [f"{_server_init.MODULE_PREFIX}{m}" for m in dict.fromkeys(modules)]
    multiprocessing.forkserver.set_forkserver_preload(current + extra + named)
    multiprocessing.forkserver.ensure_running()


def _forkserver_running() -> bool:
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    return getattr(server, "_forkserver_pid", None) is not None


_preparation_lock = threading.Lock()
_preparation_installed = False


def preparation_without_main() -> None:
    """Makes the preparation data of chute's workers leave the main module out.

    multiprocessing tells every process it starts with `spawn` or `forkserver` how to
    prepare (`multiprocessing.spawn.get_preparation_data`): `sys.path`, the working
    directory, and the main script's path or module name, which the child then runs as
    `__mp_main__` (its whole top level: a script without an `if __name__ ==
    "__main__":` guard would delete and rewrite its data files, read stdin, parse argv or
    start workers again there). chute's workers need nothing from it: what the user
    defined in `__main__` reaches them by value (cloudpickle), everything else by module
    reference. So for processes named `WORKER_NAME_PREFIX...` the two keys naming the
    main module are dropped; every other process (the user's own) is prepared as before.
    Installed once per process; idempotent and thread-safe.
    """
    global _preparation_installed
    from multiprocessing import spawn

    with _preparation_lock:
        if _preparation_installed:
            return
        original = spawn.get_preparation_data

        def get_preparation_data(name: str) -> dict[str, object]:
            data = original(name)
            if name.startswith(WORKER_NAME_PREFIX):
                data.pop("init_main_from_path", None)
                data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = get_preparation_data
        _preparation_installed = True


_forkserver_served = False  # a pool of this process has had workers from the forkserver
_forkserver_asked_at: float | None = None  # when this process first asked for the server


def mark_served() -> None:
    """A pool of this process has just started workers from the forkserver."""
    global _forkserver_served
    _forkserver_served = True


def forkserver_cold() -> bool:
    """Whether no pool of this process has had workers from the forkserver yet: the first
    pool waits for the server's imports (~0.2 s), later ones only for a fork each."""
    return not _forkserver_served


def forkserver_starting_s() -> float:
    """How long ago (s) this process first asked for the forkserver; 0.0 before it did."""
    asked = _forkserver_asked_at
    return 0.0 if asked is None else time.monotonic() - asked


def prewarm(modules: Callable[[], Iterable[str]] | None = None) -> None:
    """Starts the forkserver now, if the default start method will need it: it imports
    numpy and chute (~0.3 s, more on a busy machine) in its own process, meanwhile this one
    goes on; the first `WorkerPool` then forks at once. The server also imports what
    `modules()` names (asked only when it starts): the modules that workers would each
    import to unpickle their task. A no-op once it runs, and in a chute worker (which
    starts no workers of its own)."""
    me = multiprocessing.current_process()
    if me.name.startswith(WORKER_NAME_PREFIX) or getattr(me, "_inheriting", False):
        return
    if DEFAULT_START_METHOD == "forkserver" and not _forkserver_running():
        ensure_forkserver(modules() if modules is not None else ())
