"""Serializing elements without pickle: a JSON header plus raw array buffers.

An element is a tree of dicts (str keys), lists, tuples, numpy arrays and scalars, and
Python scalars, str, bytes and None. `encode` writes

    [u32 header length][JSON header][buffers...]

where the header mirrors the tree and array leaves point into the buffers by offset.
`decode` rebuilds the same tree, types included (a tuple stays a tuple, an `np.int32`
an `np.int32`); arrays come back writable (views of one buffer per element). Object arrays and
other types raise a `TypeError` naming the path, since they cannot be stored without
pickle.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

_LEN = struct.Struct("<I")


def encode(element: Any) -> bytes:
    """`element` as bytes.

    >>> x = {"ids": np.arange(3, dtype=np.int32), "meta": ("a", 1, 2.5, None, b"\\x00")}
    >>> y = decode(encode(x))
    >>> y["ids"], y["meta"]
    (array([0, 1, 2], dtype=int32), ('a', 1, 2.5, None, b'\\x00'))
    """
    buffers: list[bytes] = []
    offset = [0]

    def add(data: bytes) -> int:
        at = offset[0]
        buffers.append(data)
        offset[0] += len(data)
        return at

    def spec(x: Any, path: str) -> Any:
        if x is None or isinstance(x, bool | str):
            return x
        if type(x) is int or type(x) is float:
            return {"i": x} if type(x) is int else {"f": repr(x)}
        if isinstance(x, np.ndarray):
            if x.dtype.hasobject:
                raise _unsupported(x, path)
            data = np.ascontiguousarray(x).tobytes()
            return {"a": [x.dtype.str, list(x.shape), add(data), len(data)]}
        if isinstance(x, np.generic):
            if x.dtype.hasobject:
                raise _unsupported(x, path)
            data = x.tobytes()
            return {"n": [x.dtype.str, add(data), len(data)]}
        if isinstance(x, bytes):
            return {"b": [add(x), len(x)]}
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise TypeError(
                    f"cache: {path} has non-string keys {[k for k in x if not isinstance(k, str)]}:"
                    " a cached element's dict keys must be strings; convert them in a map."
                )
            return {"d": [[k, spec(v, f"{path}[{k!r}]")] for k, v in x.items()]}
        if isinstance(x, list):
            return {"l": [spec(v, f"{path}[{i}]") for i, v in enumerate(x)]}
        if type(x) is tuple:
            return {"t": [spec(v, f"{path}[{i}]") for i, v in enumerate(x)]}
        raise _unsupported(x, path)

    header = json.dumps(spec(element, "element"), separators=(",", ":")).encode()
    return b"".join([_LEN.pack(len(header)), header, *buffers])


def _unsupported(x: Any, path: str) -> TypeError:
    return TypeError(
        f"cache: {path} is a {type(x).__name__}, which chute cannot store without pickle: "
        "cached elements may hold dicts, lists, tuples, numpy arrays (not of objects), "
        "numbers, str, bytes and None; convert it in a map before the cache."
    )


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The element `encode` wrote."""
    (n,) = _LEN.unpack_from(data, 0)
    header = json.loads(bytes(data[4 : 4 + n]))
    payload = bytearray(data[4 + n :])

    def build(s: Any) -> Any:
        if not isinstance(s, dict):
            return s
        (kind, v), *_ = s.items()
        if kind == "a":
            dtype, shape, at, size = v
            dt = np.dtype(dtype)
            if size == 0 or dt.itemsize == 0:
                return np.zeros(shape, dtype=dt)
            return np.frombuffer(payload, dtype=dt, count=size // dt.itemsize, offset=at).reshape(
                shape
            )
        if kind == "i":
            return v
        if kind == "f":
            return float(v)
        if kind == "n":
            dtype, at, size = v
            return np.frombuffer(payload, dtype=np.dtype(dtype), count=1, offset=at)[0]
        if kind == "b":
            at, size = v
            return bytes(payload[at : at + size])
        if kind == "d":
            return {k: build(x) for k, x in v}
        if kind == "l":
            return [build(x) for x in v]
        return tuple(build(x) for x in v)

    return build(header)
