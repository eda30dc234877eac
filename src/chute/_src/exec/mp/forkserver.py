"""How chute starts its worker processes: a forkserver and a process class of its own.

chute runs inside a process it does not own, so it changes nothing of `multiprocessing`
there: the user's own pools, contexts and forkserver behave as they would without chute.

- **chute's own forkserver.** `ensure_forkserver` starts a `multiprocessing.forkserver.
  ForkServer` instance that belongs to chute (not the process-wide one that
  `multiprocessing.get_context("forkserver")` uses): its preload list is chute's alone,
  set with the class's public `set_forkserver_preload`. It imports numpy, chute's worker
  module and the modules a pool's tasks need (`_server_init`), once, so that workers
  forked from it find them imported, and it never imports the main script (`__main__` is
  not in its list).
- **chute's own process class** (`worker_context`). multiprocessing tells every process it
  starts with `spawn` or `forkserver` how to prepare (`spawn.get_preparation_data`):
  `sys.path`, the working directory, and the main script's path or module name, which the
  child then runs as `__mp_main__` (its whole top level: a script without an `if __name__
  == "__main__":` guard would delete and rewrite its data files, read stdin, parse argv or
  start workers again there). chute's workers need nothing from it: what the user defined
  in `__main__` reaches them by value (cloudpickle), everything else by module reference.
  So chute's process classes send preparation data without the two keys naming the main
  module (`worker_preparation_data`), through Popen classes of their own that implement
  multiprocessing's launch hook; `multiprocessing.spawn` itself is left as it is.
- `prewarm` starts the server at the first `iter()` of a pipeline with workers (never
  while a dataset is only being built); `forkserver_cold` and `forkserver_starting_s` say
  whether a pool still waits for it. The pool (`pool.py`) starts its workers through these.
"""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.spawn
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from chute._src.exec.mp import _server_init
from chute._src.exec.mp._worker import WORKER_NAME_PREFIX

__all__ = [
    "DEFAULT_START_METHOD",
    "FORKSERVER_PRELOAD",
    "ensure_forkserver",
    "forkserver_cold",
    "forkserver_starting_s",
    "mark_served",
    "prewarm",
    "worker_context",
    "worker_preparation_data",
]

# forkserver: workers are forked from a clean single-threaded server process, so a parent
# with threads (JAX, gRPC, a prefetch thread) is safe, and starting a worker costs a fork,
# not a fresh interpreter. `fork` is faster still but can deadlock a child when the
# parent has threads holding locks; `spawn` re-imports everything in every worker.
DEFAULT_START_METHOD = "forkserver"

# Imported first by chute's forkserver. `_server_init` sets the workers' native thread
# counts, then imports numpy, the worker's module and the modules named with its prefix.
FORKSERVER_PRELOAD = ("chute._src.exec.mp._server_init",)

_lock = threading.Lock()
_server: multiprocessing.forkserver.ForkServer | None = None  # chute's, once started
_forkserver_served = False  # a pool of this process has had workers from the forkserver
_forkserver_asked_at: float | None = None  # when this process first asked for the server


def worker_preparation_data(name: str) -> dict[str, object]:
    """What a chute worker named `name` is told to prepare: multiprocessing's preparation
    data without the main module (see the module's docstring)."""
    data: dict[str, object] = multiprocessing.spawn.get_preparation_data(name)
    data.pop("init_main_from_path", None)
    data.pop("init_main_from_name", None)
    return data


def ensure_forkserver(modules: Iterable[str] = ()) -> multiprocessing.forkserver.ForkServer:
    """chute's forkserver, started unless it runs. A server started here imports numpy,
    chute's worker module and `modules` once, so that workers forked from it find them
    imported; it never imports the main script."""
    global _server, _forkserver_asked_at
    with _lock:
        if _forkserver_asked_at is None:
            _forkserver_asked_at = time.monotonic()
        if _server is None:
            server = multiprocessing.forkserver.ForkServer()
            named = [f"{_server_init.MODULE_PREFIX}{m}" for m in dict.fromkeys(modules)]
            server.set_forkserver_preload([*FORKSERVER_PRELOAD, *named])
            _server = server
        server = _server
    server.ensure_running()  # restarts it if it died (its own lock)
    return server


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


if hasattr(multiprocessing.context, "ForkServerProcess"):  # POSIX
    from multiprocessing import popen_forkserver, popen_spawn_posix, reduction, util

    def _pickled_for_child(popen: Any, process_obj: Any) -> io.BytesIO:
        """chute's preparation data (no main script) and the process object, pickled as
        the standard Popen classes' `_launch` pickles them for the child."""
        buf = io.BytesIO()
        multiprocessing.context.set_spawning_popen(popen)
        try:
            reduction.dump(worker_preparation_data(process_obj.name), buf)
            reduction.dump(process_obj, buf)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        return buf

    class _ForkServerPopen(popen_forkserver.Popen):
        """multiprocessing's forkserver Popen, launching from chute's server with chute's
        preparation data (the body of the standard `_launch`, with those two changed)."""

        _fds: list[int]  # set by the base class: the descriptors the child inherits

        def _launch(self, process_obj: Any) -> None:
            buf = _pickled_for_child(self, process_obj)
            self.sentinel, w = ensure_forkserver().connect_to_new_process(self._fds)
            # A duplicate of the data pipe's write end: the child's sentinel of its parent.
            parent_w = os.dup(w)
            self.finalizer = util.Finalize(self, _close_fds, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = multiprocessing.forkserver.read_signed(self.sentinel)

    class _SpawnPopen(popen_spawn_posix.Popen):
        """multiprocessing's spawn Popen with chute's preparation data."""

        _fds: list[int]

        def _launch(self, process_obj: Any) -> None:
            from multiprocessing import resource_tracker

            tracker_fd = int(resource_tracker.getfd())  # type: ignore[arg-type]
            self._fds.append(tracker_fd)
            fp = _pickled_for_child(self, process_obj)
            parent_r = child_w = child_r = parent_w = None
            try:
                parent_r, child_w = os.pipe()
                child_r, parent_w = os.pipe()
                cmd = multiprocessing.spawn.get_command_line(
                    tracker_fd=tracker_fd, pipe_handle=child_r
                )
                self._fds.extend([child_r, child_w])
                exe: Any = multiprocessing.spawn.get_executable()
                self.pid = util.spawnv_passfds(exe, cmd, self._fds)
                self.sentinel = parent_r
                with open(parent_w, "wb", closefd=False) as f:
                    f.write(fp.getbuffer())
            finally:
                to_close = [fd for fd in (parent_r, parent_w) if fd is not None]
                self.finalizer = util.Finalize(self, _close_fds, to_close)
                for fd in (child_r, child_w):
                    if fd is not None:
                        os.close(fd)

    class _ForkServerWorker(multiprocessing.context.ForkServerProcess):
        @staticmethod
        def _Popen(process_obj: Any) -> Any:
            return _ForkServerPopen(process_obj)

    class _SpawnWorker(multiprocessing.context.SpawnProcess):
        @staticmethod
        def _Popen(process_obj: Any) -> Any:
            return _SpawnPopen(process_obj)

    class _ForkServerContext(multiprocessing.context.ForkServerContext):
        Process = _ForkServerWorker

    class _SpawnContext(multiprocessing.context.SpawnContext):
        Process = _SpawnWorker

    _CONTEXTS: dict[str, Callable[[], multiprocessing.context.BaseContext]] = {
        "forkserver": _ForkServerContext,
        "spawn": _SpawnContext,
    }
else:  # pragma: no cover - Windows: spawn only, with multiprocessing's own preparation
    _CONTEXTS = {}


def worker_context(start_method: str) -> multiprocessing.context.BaseContext:
    """The context chute's workers are started from: for `forkserver` and `spawn`, one of
    chute's own (its server, its preparation data); `fork` prepares nothing."""
    make = _CONTEXTS.get(start_method)
    if make is not None:
        return make()
    return multiprocessing.get_context(start_method)


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
    import to unpickle their task. A no-op once started, and in a chute worker (which
    starts no workers of its own). Called by the first `iter()` of a pipeline with
    workers, never while a dataset is only being built."""
    if multiprocessing.current_process().name.startswith(WORKER_NAME_PREFIX):
        return
    if DEFAULT_START_METHOD == "forkserver" and _server is None:
        ensure_forkserver(modules() if modules is not None else ())
