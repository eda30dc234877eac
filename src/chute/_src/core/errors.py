"""chute's exceptions, and the note that ties a user's exception to a stage.

chute raises few exception types of its own: `CheckpointError` for a state that does not
fit the pipeline it is restored into, `DataError` for a file or record that is corrupt or
malformed. A user's own exception (raised inside a map function, a source's
`__getitem__`, ...) is re-raised unchanged, with its original type and traceback, plus a
note naming the stage and element index where it happened.
"""

from __future__ import annotations

import contextlib

__all__ = ["CheckpointError", "ChuteError", "DataError", "MissingFileError", "add_stage_note"]

_NOTED = "_chute_stage_noted"


class ChuteError(Exception):
    """Base class of the errors chute raises itself."""


class CheckpointError(ChuteError, ValueError):
    """An iterator state that does not fit the pipeline it is being restored into."""


class DataError(ChuteError, ValueError):
    """A file or record that is corrupt, truncated or malformed."""


class MissingFileError(DataError, FileNotFoundError):
    """A data file, object or pattern that names nothing: a `DataError`, and a
    `FileNotFoundError`."""


def add_stage_note(exc: BaseException, stage: object, index: int | None) -> None:
    """Attaches `chute: raised in stage S at element index I` to `exc`, once.

    Only the innermost stage notes the exception: outer stages see it already marked.
    """
    if getattr(exc, _NOTED, False):
        return
    where = f" at element index {index}" if index is not None else ""
    exc.add_note(f"chute: raised in stage {stage!r}{where}")
    with contextlib.suppress(AttributeError):  # __slots__ exceptions keep the note only
        setattr(exc, _NOTED, True)
