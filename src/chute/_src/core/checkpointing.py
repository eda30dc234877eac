"""Iterator states in files: `save`/`load`, and the JSON text the other formats share.

A checkpoint file is one JSON object: a small header and the iterator's state,

    {"format": "chute.iterator_state", "version": 1, "state": {...get_state()...}}

The state itself records what fixes the pipeline's positions (its stages, sources'
lengths, seeds, batch sizes), so `set_state` rejects a file of another pipeline, naming
the first difference, and carries a checksum of its values (`_src/core/state_checks.py`), so a
state changed after it was saved is rejected too. Reading is bounded: only a regular file
of at most `MAX_FILE_BYTES` is read, and its JSON is checked for depth, long strings and
repeated keys before it is restored. Files are written atomically: a
temporary file in the same directory, flushed and fsynced, then `os.replace`d over the
target and the directory fsynced, so a reader sees the old file or the new one, never a
part. The iterator's state itself is a black box here: whatever `get_state()` returns,
`set_state()` receives back.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from typing import TYPE_CHECKING, Any

from chute._src.core.errors import CheckpointError
from chute._src.core.state_checks import (
    MAX_FILE_BYTES,
    check_bounds,
    duplicated_error,
    duplicated_key,
    parse_json,
    quote,
    unseal,
    verify,
)

if TYPE_CHECKING:
    from chute._src.core.iterator import DatasetIterator

FORMAT = "chute.iterator_state"
VERSION = 1

STATE_DICT_KEY = "chute_state"
"""The one key of `DatasetIterator.state_dict()`: the state as JSON text, a single string
that torch.distributed.checkpoint and torch.save store as they are."""


def encode(state: Any) -> str:
    """The checkpoint file's text for `state`."""
    header = {"format": FORMAT, "version": VERSION}
    return json.dumps({**header, "state": state}, indent=1) + "\n"


def decode(text: str | bytes, where: str) -> Any:
    """The state in a checkpoint file's text, checked for bounds and against its checksum
    (and returned without it); `CheckpointError` naming `where` if the text is not one."""
    fix = (
        "restore from a complete file written by chute.checkpoint.save (or chute's Orbax "
        "handler) for this pipeline; a file cut short by a crash is never left by chute, so "
        "this one was changed or copied incompletely: use an earlier checkpoint"
    )
    doc = parse_json(text, where, levels=1, fix=fix)
    if (key := duplicated_key(doc)) is not None:
        raise duplicated_error(where, key)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        kind = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise CheckpointError(
            f"{where} is not a chute checkpoint: its format is {quote(kind)}, not "
            f"{FORMAT!r}; {fix}."
        )
    if doc.get("version") != VERSION or "state" not in doc:
        raise CheckpointError(
            f"{where} is a chute checkpoint of version {quote(doc.get('version'))}, but this "
            f"chute reads version {VERSION}: load it with the chute version that wrote it."
        )
    # Checked once here, and handed on without its checksum: `set_state` then restores it
    # without computing the checksum of a large state a second time.
    return unseal(doc["state"], where)


def restore_from(iterator: DatasetIterator[Any], state: Any, where: str) -> None:
    """`iterator.set_state(state)`; a rejected state's `CheckpointError` names the file
    first (the iterator is then unchanged: `set_state` leaves it as it was)."""
    try:
        iterator.set_state(state)
    except CheckpointError as e:
        raise CheckpointError(f"{where} does not fit this pipeline: {e}") from None


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Writes `text` to `path`: temporary file, fsync, `os.replace`, fsync of the directory."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # not every file system lets a directory be fsynced
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def read_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a checkpoint file, or `CheckpointError` naming it when it cannot be read,
    is not a regular file (a FIFO, a device: never waited on or read) or is too large."""
    where = repr(os.fspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CheckpointError(
            f"{where} does not exist: give the path a checkpoint was saved to "
            "(chute.checkpoint.save(path, iterator))."
        ) from None
    except OSError as e:
        raise CheckpointError(
            f"{where} cannot be read as a chute checkpoint ({e.strerror}): give the path "
            "of a file written by chute.checkpoint.save."
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointError(
                f"{where} is not a regular file (it is a {_kind(st.st_mode)}): chute reads a "
                "checkpoint only from a file chute.checkpoint.save wrote; give that path."
            )
        if st.st_size > MAX_FILE_BYTES:
            raise CheckpointError(
                f"{where} is {st.st_size} bytes, over the limit of {MAX_FILE_BYTES} for a "
                "chute checkpoint (a state is a few kB): give the path of a file written by "
                "chute.checkpoint.save."
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)  # a file that grew meanwhile: parse_json says so
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def save(path: str | os.PathLike[str], iterator: DatasetIterator[Any]) -> None:
    """Writes `iterator.get_state()` to `path` as JSON, atomically.

    >>> import chute, tempfile, os
    >>> it = iter(chute.MapDataset.range(10).shuffle(seed=1).to_iter_dataset())
    >>> first = [next(it) for _ in range(3)]
    >>> path = os.path.join(tempfile.mkdtemp(), "data.json")
    >>> chute.checkpoint.save(path, it)
    >>> rest = list(it)
    >>> it = chute.checkpoint.load(path, iter(chute.MapDataset.range(10).shuffle(seed=1).to_iter_dataset()))
    >>> list(it) == rest
    True
    """
    write_atomic(path, encode(iterator.get_state()))


def load(path: str | os.PathLike[str], iterator: DatasetIterator[Any]) -> DatasetIterator[Any]:
    """Restores `iterator` from the file `save` wrote at `path`, and returns it.

    Raises `CheckpointError` naming the path for a file that is missing, not JSON, not a
    chute checkpoint, or of another pipeline; the iterator is then unchanged.
    """
    where = repr(os.fspath(path))
    restore_from(iterator, decode(read_file(path), where), where)
    return iterator


def to_state_dict(state: Any) -> dict[str, str]:
    return {STATE_DICT_KEY: json.dumps(state)}


def from_state_dict(state_dict: Any) -> Any:
    """The state in what `state_dict()` returned (after a trip through torch), checked for
    bounds and against its checksum."""
    if not isinstance(state_dict, dict) or set(state_dict) != {STATE_DICT_KEY}:
        keys = (
            quote(sorted(map(str, state_dict)))
            if isinstance(state_dict, dict)
            else type(state_dict).__name__
        )
        raise CheckpointError(
            f"load_state_dict: got {keys}, expected a dict with the one key "
            f"{STATE_DICT_KEY!r}: pass what state_dict() returned (for a dict from "
            "get_state(), call set_state instead)."
        )
    text = state_dict[STATE_DICT_KEY]
    where = f"load_state_dict: state_dict[{STATE_DICT_KEY!r}]"
    if not isinstance(text, str | bytes):
        raise CheckpointError(
            f"{where} is a {type(text).__name__}, not the JSON text state_dict() wrote: pass "
            "what state_dict() returned."
        )
    state = parse_json(text, where)
    check_bounds(state, where)
    verify(state, where)
    return state
