"""What a state must be before chute restores it: within bounds, and as it was saved.

Bounds. A state is small JSON shaped like the pipeline, so chute refuses, before it
allocates anything in proportion to them: a file that is not a regular file or is over
`MAX_FILE_BYTES`, JSON nested deeper than `MAX_DEPTH`, a string longer than `MAX_STRING`,
more than `MAX_VALUES` values in all, and a JSON object with a key twice. Every refusal is a `CheckpointError` naming where the
state came from and the path inside it, and quotes at most about `QUOTE_CHARS` characters
of a value (`quote`).

Checksum. `seal(state)` adds `"checksum"`: the first 16 hex digits of the SHA-256 of the
state's canonical JSON without that key (sorted keys, no spaces, ASCII), so `seal` of a
sealed state gives the same state back. `unseal` checks it, so a state edited after it was
saved (a counter moved by one is a plausible value no range check can catch) raises
`CheckpointError`. A state without the key is restored unchecked: states saved before
chute sealed them, and states a user edited on purpose and unsealed by deleting the key.
Only chute's own states are sealed (a dict with a "stage"): the state of a user's
Grain-style iterator at the top of a pipeline is handed out as the user's iterator made
it, as Grain does, and a state that is not JSON carries no checksum.
"""

from __future__ import annotations

import hashlib
import json
import re
import reprlib
from typing import Any

import numpy as np

from chute._src.core.errors import CheckpointError

MAX_FILE_BYTES = 64 << 20
"""The largest checkpoint file or `state_dict()` text read (a state is a few kB; one with
the pending indices of many hosts a few MB)."""

MAX_DEPTH = 256
"""How deeply lists and dicts may nest in a state: a state nests one level per iterator
stage and a few within a stage, so this is far beyond any pipeline's (and within what
Python's JSON reader and writer handle without hitting the recursion limit)."""

MAX_STRING = 1 << 20
"""The longest string in a state (stage names, parameters, identities are short)."""

MAX_VALUES = 5 << 20
"""The most values (numbers, strings, lists, dicts) in lists and dicts of one state: the
largest state chute writes, a merged `ElasticIterator` state, lists at most 4 Mi indices
(`MAX_MERGED_PENDING`), and the rest of a state is a few hundred values. Counted before a
state is parsed (its commas) and before it is walked (the containers' lengths), so a
crafted state of tens of millions of values is refused in well under a second."""

QUOTE_CHARS = 100
"""About how many characters of a value an error quotes."""

CHECKSUM_KEY = "checksum"

_FIX = "restore a state saved by chute for this pipeline, unchanged"

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = _repr.maxlong = QUOTE_CHARS
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 10
_repr.maxlevel = 3


def quote(value: Any) -> str:
    """`repr(value)` cut to about `QUOTE_CHARS` characters, saying how long it was."""
    if isinstance(value, str | bytes) and len(value) > QUOTE_CHARS:
        return f"{value[: QUOTE_CHARS - 10]!r}... ({len(value)} characters)"
    text = _repr.repr(value)
    return text if len(text) <= QUOTE_CHARS + 20 else text[:QUOTE_CHARS] + "..."


def clip_message(e: CheckpointError) -> CheckpointError:
    """`e` with its message cut to about 1,000 characters (a stage's error that quoted a
    long value whole), the start and the end kept."""
    msg = str(e)
    if len(msg) > 1000:
        e.args = (f"{msg[:700]} [... {len(msg) - 900} characters left out ...] {msg[-200:]}",)
    return e


# -- bounded JSON ------------------------------------------------------------------------------


class _Duplicated(dict[str, Any]):
    """A JSON object that had `key` twice (found and reported by `check_bounds`)."""

    key: str


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) == len(pairs):
        return d
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            break
        seen.add(k)
    dup = _Duplicated(d)
    dup.key = k
    return dup


def duplicated_key(value: Any) -> str | None:
    """The key a JSON object parsed by `parse_json` had twice (at its top), else None."""
    return value.key if isinstance(value, _Duplicated) else None


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _nested_deeper_than(text: str, limit: int) -> bool:
    """Whether lists and objects in the JSON `text` nest deeper than `limit`, found without
    parsing it (brackets inside strings do not count)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth, chunk = 0, 1 << 20
    for start in range(0, len(brackets), chunk):
        b = np.frombuffer(brackets[start : start + chunk].encode("ascii"), dtype=np.uint8)
        levels = depth + np.cumsum(np.where((b == 91) | (b == 123), 1, -1), dtype=np.int64)
        if int(levels.max()) > limit:
            return True
        depth = int(levels[-1])
    return False


def parse_json(text: str | bytes, where: str, levels: int = 0, fix: str = _FIX) -> Any:
    """The JSON value in `text` (a state, plus `levels` of wrapping around it), checked
    against the bounds before it is parsed; `CheckpointError` naming `where`, and ending in
    `fix`, otherwise."""
    if len(text) > MAX_FILE_BYTES:
        unit = "bytes" if isinstance(text, bytes) else "characters"
        raise CheckpointError(
            f"{where} is {len(text)} {unit} or more, over the limit of {MAX_FILE_BYTES} for "
            f"a chute state (a state is a few kB): it is not a chute checkpoint; {fix}."
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(
                f"{where} cannot be read as a chute checkpoint: it is not UTF-8 text "
                f"({e.reason} at byte {e.start}), so not the JSON chute wrote; {fix}."
            ) from None
    if (commas := text.count(",")) >= MAX_VALUES:
        raise CheckpointError(
            f"{where} holds {commas + 1} values or more (it has {commas} commas), over the "
            f"limit of {MAX_VALUES} for a chute state (the largest chute writes, a merged "
            f"ElasticIterator state, lists at most {MAX_VALUES - (1 << 20)} indices): it is "
            f"corrupt or not a chute state; {fix}."
        )
    if _nested_deeper_than(text, MAX_DEPTH + levels):
        raise CheckpointError(
            f"{where}: its JSON is nested more than {MAX_DEPTH} deep (lists and objects "
            f"within each other; a chute state nests about one level per stage): it is "
            f"corrupt or not a chute state; {fix}."
        )
    try:
        return json.loads(text, object_pairs_hook=_pairs)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{where} is not JSON ({quote(str(e))}); {fix}.") from None


# -- bounds of a state in memory ---------------------------------------------------------------


def _path(root: str, keys: list[Any]) -> str:
    text = root + "".join(f"[{k!r}]" for k in keys[:40])
    if len(keys) > 40 or len(text) > 2 * QUOTE_CHARS:
        return text[: 2 * QUOTE_CHARS] + f"...(depth {len(keys)})"
    return text


_SCALARS = frozenset({int, float, bool, type(None)})


def check_bounds(state: Any, where: str, root: str = "state") -> None:
    """Raises `CheckpointError` for a state nested deeper than `MAX_DEPTH`, with a string
    longer than `MAX_STRING`, with more than `MAX_VALUES` values in its lists and dicts,
    or (parsed by `parse_json`) with a key twice in an object.
    Walks the state without recursion; `where` names where it came from ("" for a state
    given in memory), `root` the state itself."""
    where = _prefix(where)
    if isinstance(state, str):
        _check_string(state, where, root, [])
    if not isinstance(state, dict | list | tuple):
        return
    stack: list[tuple[Any, list[Any]]] = [(state, [])]
    count = 0
    while stack:
        node, keys = stack.pop()
        count += len(node)
        if count > MAX_VALUES:
            raise CheckpointError(
                f"{where}{_path(root, keys)} has {len(node)} values, {count} in the state "
                f"so far, over the limit of {MAX_VALUES} for a chute state (the largest "
                f"chute writes, a merged ElasticIterator state, lists at most "
                f"{MAX_VALUES - (1 << 20)} indices): it is corrupt or not a chute state; "
                f"{_FIX}."
            )
        if len(keys) >= MAX_DEPTH:
            raise CheckpointError(
                f"{where}{_path(root, keys)} is nested more than {MAX_DEPTH} deep (lists and "
                f"dicts within each other; a chute state nests about one level per stage): "
                f"it is corrupt or not a chute state; {_FIX}."
            )
        if isinstance(node, _Duplicated):
            raise duplicated_error(f"{where}{_path(root, keys)}", node.key)
        if isinstance(node, dict):
            for k in node:
                if isinstance(k, str) and len(k) > MAX_STRING:
                    raise CheckpointError(
                        f"{where}{_path(root, keys)} has a key of {len(k)} characters "
                        f"({quote(k)}), over the limit of {MAX_STRING} for a chute state: it "
                        f"is corrupt or not a chute state; {_FIX}."
                    )
        values = node.values() if isinstance(node, dict) else node
        if set(map(type, values)) <= _SCALARS:
            continue  # numbers only (a list of indices): nothing to look into, at C speed
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            if isinstance(v, str):
                if len(v) > MAX_STRING:
                    _check_string(v, where, root, [*keys, k])
            elif isinstance(v, dict | list | tuple):
                stack.append((v, [*keys, k]))


def duplicated_error(where: str, key: str) -> CheckpointError:
    return CheckpointError(
        f"{where} has the key {quote(key)} twice: JSON readers disagree on which one "
        f"counts, and chute never writes a key twice; {_FIX}."
    )


def _check_string(s: str, where: str, root: str, keys: list[Any]) -> None:
    if len(s) > MAX_STRING:
        raise CheckpointError(
            f"{where}{_path(root, keys)} is a string of {len(s)} characters ({quote(s)}), "
            f"over the limit of {MAX_STRING} for a chute state: it is corrupt or not a "
            f"chute state; {_FIX}."
        )


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


# -- checksum ----------------------------------------------------------------------------------


def checksum(state: dict[str, Any]) -> str | None:
    """The checksum of `state`'s values (all but the checksum key), or None for a state
    that is not JSON."""
    rest = {k: v for k, v in state.items() if k != CHECKSUM_KEY}
    try:
        if not _str_keys_only(rest):
            # Through JSON once first, so that a state and its JSON round trip (int keys
            # as strings, sorted as strings) have one canonical text.
            rest = json.loads(json.dumps(rest))
        # With string keys only, a state and its round trip (tuples as lists) already give
        # the same text: one pass (a state read from a file has string keys only).
        canonical = json.dumps(rest, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]


def _str_keys_only(state: Any) -> bool:
    """Whether every dict in `state` has only `str` keys (lists of numbers are skipped at
    C speed, as in `check_bounds`)."""
    stack = [state]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if not all(type(k) is str for k in node):
                return False
            values: Any = node.values()
        elif isinstance(node, list | tuple):
            values = node
        else:
            continue
        if set(map(type, values)) <= _SCALARS:
            continue
        stack.extend(v for v in values if isinstance(v, dict | list | tuple))
    return True


def _sealed_kind(state: Any, any_dict: bool) -> bool:
    """Whether `state` is one chute seals: the state of a chute stage (a dict with a
    "stage"), or with `any_dict` any dict (the few dicts of chute's own that are no stage's
    state, such as chute.torch's)."""
    return isinstance(state, dict) and (any_dict or "stage" in state)


def seal(state: Any, *, any_dict: bool = False) -> Any:
    """`state` with its checksum, if it is a state chute seals (`_sealed_kind`) and JSON;
    anything else as it is (a user iterator's own state at the top of a pipeline is
    handed out unchanged, as Grain does)."""
    if not _sealed_kind(state, any_dict):
        return state
    digest = checksum(state)
    if digest is None:
        return state
    return {**{k: v for k, v in state.items() if k != CHECKSUM_KEY}, CHECKSUM_KEY: digest}


def verify(state: Any, where: str, root: str = "state", *, any_dict: bool = False) -> None:
    """Raises `CheckpointError` when `state` (one chute seals) has a checksum its values do
    not give."""
    if not _sealed_kind(state, any_dict) or CHECKSUM_KEY not in state:
        return
    recorded = state[CHECKSUM_KEY]
    actual = checksum(state)
    if recorded == actual:
        return
    raise CheckpointError(
        f"{_prefix(where)}{root} was changed after it was saved: its "
        f"{root}[{CHECKSUM_KEY!r}] = {quote(recorded)} is not the checksum of its values "
        f"({actual or 'none: they are not JSON'}). Restore the state exactly as chute saved "
        "it (get_state(), state_dict(), chute.checkpoint.save); to restore a state you "
        f"edited on purpose, delete its {CHECKSUM_KEY!r} key, and chute restores it "
        "unchecked."
    )


def unseal(state: Any, where: str = "", root: str = "state", *, any_dict: bool = False) -> Any:
    """`state` checked (bounds, checksum) and without its checksum key: what the pipeline's
    iterators restore."""
    check_bounds(state, where, root)
    verify(state, where, root, any_dict=any_dict)
    if _sealed_kind(state, any_dict) and CHECKSUM_KEY in state:
        return {k: v for k, v in state.items() if k != CHECKSUM_KEY}
    return state
