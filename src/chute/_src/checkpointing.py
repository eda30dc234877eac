"""Iterator states in files: `save`/`load`, and the JSON text the other formats share.

A checkpoint file is one JSON object: a small header and the iterator's state,

    {"format": "chute.iterator_state", "version": 1, "state": {...get_state()...}}

The state itself records what fixes the pipeline's positions (its stages, sources'
lengths, seeds, batch sizes), so `set_state` rejects a file of another pipeline, naming
the first difference. Files are written atomically: a
temporary file in the same directory, flushed and fsynced, then `os.replace`d over the
target and the directory fsynced, so a reader sees the old file or the new one, never a
part. The iterator's state itself is a black box here: whatever `get_state()` returns,
`set_state()` receives back.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

from chute._src.errors import CheckpointError

if TYPE_CHECKING:
    from chute._src.iterator import DatasetIterator

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
    """The state in a checkpoint file's text; `CheckpointError` naming `where` if the text
    is not one."""
    fix = (
        "restore from a complete file written by chute.checkpoint.save (or chute's Orbax "
        "handler) for this pipeline; a file cut short by a crash is never left by chute, so "
        "this one was changed or copied incompletely: use an earlier checkpoint"
    )
    try:
        doc = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{where} is not a chute checkpoint: it is not JSON ({e}); {fix}."
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        kind = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise CheckpointError(
            f"{where} is not a chute checkpoint: its format is {kind!r}, not {FORMAT!r}; {fix}."
        )
    if doc.get("version") != VERSION or "state" not in doc:
        raise CheckpointError(
            f"{where} is a chute checkpoint of version {doc.get('version')!r}, but this chute "
            f"reads version {VERSION}: load it with the chute version that wrote it."
        )
    return doc["state"]


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


def read_text(path: str | os.PathLike[str]) -> str:
    """The text of a checkpoint file, or `CheckpointError` naming it when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise CheckpointError(
            f"{os.fspath(path)!r} does not exist: give the path a checkpoint was saved to "
            "(chute.checkpoint.save(path, iterator))."
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{os.fspath(path)!r} cannot be read as a chute checkpoint ({e}): give the path "
            "of a file written by chute.checkpoint.save."
        ) from None


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
    restore_from(iterator, decode(read_text(path), where), where)
    return iterator


def to_state_dict(state: Any) -> dict[str, str]:
    return {STATE_DICT_KEY: json.dumps(state)}


def from_state_dict(state_dict: Any) -> Any:
    """The state in what `state_dict()` returned (after a trip through torch)."""
    if not isinstance(state_dict, dict) or set(state_dict) != {STATE_DICT_KEY}:
        keys = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
        raise CheckpointError(
            f"load_state_dict: got {keys}, expected a dict with the one key "
            f"{STATE_DICT_KEY!r}: pass what state_dict() returned (for a dict from "
            "get_state(), call set_state instead)."
        )
    text = state_dict[STATE_DICT_KEY]
    if isinstance(text, bytes):
        text = text.decode()
    if not isinstance(text, str):
        raise CheckpointError(
            f"load_state_dict: state_dict[{STATE_DICT_KEY!r}] is a {type(text).__name__}, "
            "not the JSON text state_dict() wrote: pass what state_dict() returned."
        )
    try:
        return json.loads(text)
    except ValueError as e:
        raise CheckpointError(
            f"load_state_dict: state_dict[{STATE_DICT_KEY!r}] is not JSON ({e}): pass what "
            "state_dict() returned, unchanged."
        ) from None
