"""Imported by the forkserver as it starts: runs the main script there once, as
`__mp_main__`, so that workers forked from it find it imported instead of each running it
again (its imports: numpy, a tokenizer, torch or jax) at every start. Then it imports the
modules the process that started the server named (those its workers' tasks are
unpickled with: chute's stages, the user's functions), for the same reason.

Python's forkserver means to do this (`__main__` is in its default preload list), but
3.11 looks up the main script's path under a key the preparation data does not use, so it
never does. `pool._ensure_forkserver` passes what the main process's workers would be
told (`multiprocessing.spawn.get_preparation_data`) in the environment variable
`MAIN_ENV` while it starts the server; only a process started as the forkserver acts on
it. A worker's own preparation then sees `__main__` already at that path (or module
name) and leaves it.

Whatever goes wrong here (the script or a module raises, exits, or starts workers at
import because it has no `if __name__ == "__main__":` guard) leaves the server as it was:
each worker then imports the script or module itself, as without this module, and fails
there with the usual explanation. Standard library only: this runs before anything else
in the server.
"""

from __future__ import annotations

import json
import os
import sys

MAIN_ENV = "CHUTE_FORKSERVER_MAIN"

# True while the main script runs here: starting workers then stops it (see
# `pool._exit_if_importing_main_in_a_worker`).
running = False


class PreloadStopped(BaseException):
    """Raised in the server when the main script, run there, starts chute workers."""


def _preload(spec: dict[str, object]) -> None:
    from multiprocessing import process

    global running
    sys_path = spec.get("sys_path")
    if isinstance(sys_path, list):
        sys.path[:] = [p for p in sys_path if isinstance(p, str)]
    me = process.current_process()
    me._inheriting = True  # type: ignore[attr-defined]
    running = True
    try:
        _import_main(spec)
        names = spec.get("modules")
        for name in names if isinstance(names, list) else []:
            if isinstance(name, str):
                _import_module(name)
    finally:
        running = False
        del me._inheriting  # type: ignore[attr-defined]


def _import_main(spec: dict[str, object]) -> None:
    from multiprocessing import spawn

    path = spec.get("path")
    name = spec.get("name")
    if isinstance(path, str) and not os.path.isabs(path) and spec.get("dir") != os.getcwd():
        return  # a relative path from another directory: the workers resolve it themselves
    modules = dict(sys.modules)
    try:
        if isinstance(name, str):
            spawn._fixup_main_from_name(name)  # type: ignore[attr-defined]
        elif isinstance(path, str):
            spawn.import_main_path(path)
    except BaseException:
        # Leave `__main__` as it was: each worker imports the script again and fails
        # there, with the error its main process explains.
        for key in ("__main__", "__mp_main__"):
            if key in modules:
                sys.modules[key] = modules[key]
            else:
                sys.modules.pop(key, None)


def _import_module(name: str) -> None:
    """Imports `name`; a failure leaves it to the workers, which import it themselves (a
    module that failed half-way is not left in `sys.modules`)."""
    import importlib

    try:
        importlib.import_module(name)
    except BaseException:
        pass


def _in_forkserver() -> bool:
    """Whether this process is multiprocessing's forkserver (started with `python -c` and
    its main function): another process that inherited the variable (one started by
    another thread while the server was being started) must not run the script."""
    argv = getattr(sys, "orig_argv", [])
    return any("multiprocessing.forkserver import main" in a for a in argv)


def _run() -> None:
    if not _in_forkserver():
        return
    raw = os.environ.pop(MAIN_ENV, None)
    if not raw:
        return
    try:
        spec = json.loads(raw)
    except ValueError:
        return
    if isinstance(spec, dict):
        _preload(spec)


_run()
