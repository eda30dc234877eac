"""`CheckpointHandler`: Orbax saves and restores a chute iterator beside the model.

The handler is Grain's (`grain.checkpoint.CheckpointHandler`): each process writes its own
iterator's state to `process_{i}-of-{n}.json` in the item's directory (i, n: JAX's process
index and count), atomically, in the format of `chute.checkpoint.save`. The class itself
needs neither Orbax nor JAX; the argument classes `CheckpointSave`/`CheckpointRestore`
subclass Orbax's and are made (and registered with this handler) on first use
(`_src/orbax_args.py`), so `import chute` never imports Orbax.
"""

from __future__ import annotations

import os
import re
from typing import Any

from chute._src.checkpointing import decode, encode, read_text, restore_from, write_atomic
from chute._src.errors import CheckpointError


def process_index_and_count() -> tuple[int, int]:
    """`(jax.process_index(), jax.process_count())`, or `(0, 1)` without JAX."""
    try:
        import jax
    except ImportError:
        return 0, 1
    return jax.process_index(), jax.process_count()


def state_file_name(process_index: int, process_count: int) -> str:
    return f"process_{process_index}-of-{process_count}.json"


class CheckpointHandler:
    """Orbax `CheckpointHandler` for chute iterators (Grain's name and behaviour).

    Use it through `ocp.args.Composite(..., data=chute.checkpoint.CheckpointSave(it))` in
    an `ocp.CheckpointManager`; restore with `CheckpointRestore(it)`, which restores `it`
    in place, starts its prefetch and returns it. Every process saves and restores its own
    iterator; restoring needs the same number of processes.
    """

    def save(self, directory: Any, item: Any = None, args: Any = None) -> None:
        """Writes the iterator's state (`item`, or `args.item`) under `directory`."""
        item = item if item is not None else args.item
        index, count = process_index_and_count()
        path = _local(directory, state_file_name(index, count))
        text = encode(item.get_state())
        if isinstance(path, str):
            write_atomic(path, text)
        else:  # a remote path (gs://...): the file system's own write
            path.write_text(text)

    def restore(self, directory: Any, item: Any = None, args: Any = None) -> Any:
        """Restores the iterator (`item`, or `args.item`) from `directory` and returns it."""
        item = item if item is not None else args.item
        index, count = process_index_and_count()
        name = state_file_name(index, count)
        path = _local(directory, name)
        if not (os.path.exists(path) if isinstance(path, str) else path.exists()):
            raise CheckpointError(_missing(directory, name, count))
        text = read_text(path) if isinstance(path, str) else path.read_text()
        where = repr(str(path))
        restore_from(item, decode(text, where), where)
        item.start_prefetch()
        return item

    # Required by Orbax's interface; a chute checkpoint has no structure or metadata.
    def structure(self, directory: Any) -> Any:
        del directory
        return None

    def metadata(self, directory: Any) -> Any:
        del directory
        return None

    def finalize(self, directory: Any) -> None:
        del directory

    def close(self) -> None:
        pass

    @classmethod
    def typestr(cls) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"


def _local(directory: Any, name: str) -> Any:
    """`directory / name` as a local path string, or as the path object for a remote one."""
    joined = directory / name if not isinstance(directory, str) else os.path.join(directory, name)
    text = str(joined)
    if "://" in text:
        return joined
    return os.fspath(joined)


def _missing(directory: Any, name: str, count: int) -> str:
    try:
        names = os.listdir(os.fspath(directory))
    except (OSError, TypeError):
        names = []
    counts = sorted(
        {int(m[1]) for n in names if (m := re.fullmatch(r"process_\d+-of-(\d+)\.json", n))}
    )
    why = (
        f"it was saved by {' or '.join(map(str, counts))} processes, and this run has {count}: "
        "restore with the same number of processes"
        if counts and count not in counts
        else "restore from a checkpoint that saved this item with chute.checkpoint.CheckpointSave"
    )
    return f"{os.path.join(str(directory), name)!r} does not exist: {why}."
