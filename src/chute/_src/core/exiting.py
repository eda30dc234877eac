"""What a chute iterator does when the interpreter exits under a thread using it.

At exit Python stops the main thread, runs the `atexit` hooks (which close chute's worker
pools and thread pools) and then freezes the daemon threads where they are. A daemon
thread still iterating in between finds its pool closed, and its exception would print a
traceback of dozens of lines at every exit. Such a thread is parked instead: it waits,
silently, until the interpreter freezes it, as it would have been without chute. A thread
that is not a daemon, or any thread while the main thread still runs, gets its exception
as always.
"""

from __future__ import annotations

import threading

__all__ = ["park_if_abandoned"]


# How long a daemon thread whose iterator failed waits to see whether the main thread is
# exiting (the failure may come from `atexit` hooks that run just before it stops).
EXIT_WAIT_S = 0.2


def park_if_abandoned() -> None:
    """Blocks for good if the interpreter is exiting and this is a daemon thread (its
    pending exception is then never printed); returns otherwise, at once in any thread
    but a daemon one, within `EXIT_WAIT_S` in a daemon thread."""
    me = threading.current_thread()
    main = threading.main_thread()
    if not me.daemon or me is main:
        return
    # `threading._SHUTTING_DOWN` is set as the exit begins, before the hooks that close
    # thread pools (and make them refuse work) run; where it is missing, the main thread
    # stopping says the same a little later.
    if not getattr(threading, "_SHUTTING_DOWN", False):
        main.join(EXIT_WAIT_S)  # returns once the interpreter has stopped the main thread
        if main.is_alive():
            return
    threading.Event().wait()
