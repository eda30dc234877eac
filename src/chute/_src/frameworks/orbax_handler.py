"""`CheckpointHandler`: Orbax saves and restores a chute iterator beside the model.

The handler is Grain's (`grain.checkpoint.CheckpointHandler`): each process writes its own
iterator's state to `process_{i}-of-{n}.json` in the item's directory (i, n: JAX's process
index and count), atomically, in the format of `chute.checkpoint.save`. The class itself
needs neither Orbax nor JAX; the argument classes `CheckpointSave`/`CheckpointRestore`
subclass Orbax's and are made (and registered with this handler) on first use
(`_src/frameworks/orbax_args.py`), so `import chute` never imports Orbax.

Restoring with another process count works for `chute.experimental.ElasticIterator`:
when this run's file is missing and the directory holds the files of all processes of
one other count, each process reads them all and restores the merge of their states
(`ElasticIterator.merge_states`). Any other iterator needs the same process count.

Reading is bounded as `chute.checkpoint.load`'s is (`_src/core/checkpointing.py`): process
counts in file names count only when that many files are there, and a file is read only
when it is a regular file of at most `MAX_FILE_BYTES`.
"""

from __future__ import annotations

import os
import re
from typing import Any

from chute._src.core.checkpointing import decode, encode, read_file, restore_from, write_atomic
from chute._src.core.errors import CheckpointError
from chute._src.core.state_checks import MAX_FILE_BYTES

_FILE_NAME = re.compile(r"process_(\d{1,18})-of-(\d{1,18})\.json")
"""A process's file; counts of more than 18 digits are no process count of a real run."""


def orbax_class(name: str) -> Any:
    """`CheckpointHandler`, `CheckpointSave` or `CheckpointRestore` as Orbax takes them
    (`_src/frameworks/orbax_args.py`, which imports Orbax and registers the three together). Without
    Orbax the handler is this module's plain class, and the argument classes raise an
    `ImportError` naming the extra to install."""
    import importlib

    try:
        module = importlib.import_module("chute._src.frameworks.orbax_args")
    except ImportError:
        if name == "CheckpointHandler":
            return CheckpointHandler
        raise
    return getattr(module, name)


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
            merged = _merged_elastic_state(directory, count)
            if merged is None:
                raise CheckpointError(_missing(directory, name, count))
            restore_from(item, merged, f"the checkpoint files in {str(directory)!r}")
        else:
            text = read_file(path) if isinstance(path, str) else _read_remote(path)
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


def _read_remote(path: Any) -> bytes:
    """The bytes of a remote file (an `etils.epath` path), read no further than the limit
    (`decode` rejects a file that reaches it)."""
    with path.open("rb") as f:
        data: bytes = f.read(MAX_FILE_BYTES + 1)
    return data


def _merged_elastic_state(directory: Any, count: int) -> dict[str, Any] | None:
    """The merge of the `ElasticIterator` states that all processes of one other count
    saved in `directory` (a local one), or None when that is not what it holds."""
    from chute._src.frameworks.elastic import STAGE, merge_states

    try:
        names = os.listdir(os.fspath(directory))
    except (OSError, TypeError):
        return None
    by_count: dict[int, set[int]] = {}
    for n in names:
        if m := _FILE_NAME.fullmatch(n):
            by_count.setdefault(int(m[2]), set()).add(int(m[1]))
    # A count is complete when that many files are there (checked first: a file name's
    # count is never expanded into a range beyond the files that exist).
    complete = [
        n for n, seen in by_count.items() if n != count and len(seen) == n and seen == set(range(n))
    ]
    if len(complete) != 1:
        return None
    old = complete[0]
    states, names = [], []
    for i in range(old):
        path = os.path.join(os.fspath(directory), state_file_name(i, old))
        names.append(repr(path))
        states.append(decode(read_file(path), names[-1]))
    if not all(isinstance(s, dict) and s.get("stage") == STAGE for s in states):
        return None  # not an ElasticIterator's: only its states merge
    return merge_states(states, names)  # an error names the file of the state at fault


def _missing(directory: Any, name: str, count: int) -> str:
    try:
        names = os.listdir(os.fspath(directory))
    except (OSError, TypeError):
        names = []
    counts = sorted({int(m[2]) for n in names if (m := _FILE_NAME.fullmatch(n))})
    why = (
        f"it was saved by {' or '.join(map(str, counts))} processes, and this run has {count}: "
        "restore with the same number of processes (only chute.experimental.ElasticIterator restores with another)"
        if counts and count not in counts
        else "restore from a checkpoint that saved this item with chute.checkpoint.CheckpointSave"
    )
    return f"{os.path.join(str(directory), name)!r} does not exist: {why}."
