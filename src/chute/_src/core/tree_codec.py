"""Serializing elements without pickle: a structure, a few integers, raw buffers.

An element is a tree of dicts (str keys), lists, tuples, numpy arrays and scalars, and
Python scalars, str, bytes and None. `encode` writes

    [u32 n][structure: n bytes of JSON][u32 k][k int64: shapes, lengths, ints][buffers]

The structure names every node's type, dict keys and array dtypes, but no sizes or
values, so elements of one pipeline mostly share it; `decode` compiles each structure
once into a reader and reuses it. `decode` rebuilds the same tree, types included (a
tuple stays a tuple, an `np.int32` an `np.int32`); arrays come back writable (views of
one buffer per element). Object arrays and other types raise a `TypeError` naming the
path, since they cannot be stored without pickle.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def encode(element: Any) -> bytes:
    """`element` as bytes.

    >>> x = {"ids": np.arange(3, dtype=np.int32), "meta": ("a", 1, 2.5, None, b"\\x00")}
    >>> y = decode(encode(x))
    >>> y["ids"], y["meta"]
    (array([0, 1, 2], dtype=int32), ('a', 1, 2.5, None, b'\\x00'))
    """
    dims: list[int] = []
    buffers: list[bytes] = []

    def spec(x: Any, path: str) -> Any:
        t = type(x)
        if x is None:
            return "N"
        if t is bool:
            return "T" if x else "F"
        if t is int:
            if _I64_MIN <= x <= _I64_MAX:
                dims.append(x)
                return "i"
            return ["I", str(x)]
        if t is float:
            buffers.append(_F64.pack(x))
            return "f"
        if t is str:
            data = x.encode("utf-8", "surrogatepass")
            dims.append(len(data))
            buffers.append(data)
            return "s"
        if t is bytes:
            dims.append(len(x))
            buffers.append(x)
            return "b"
        if isinstance(x, np.ndarray):
            if x.dtype.hasobject:
                raise _unsupported(x, path)
            dims.extend(x.shape)
            buffers.append(np.ascontiguousarray(x).tobytes())
            return ["a", x.dtype.str, x.ndim]
        if isinstance(x, np.generic):
            if x.dtype.hasobject:
                raise _unsupported(x, path)
            buffers.append(x.tobytes())
            return ["n", x.dtype.str]
        if t is dict:
            bad = [k for k in x if not isinstance(k, str)]
            if bad:
                raise TypeError(
                    f"cache: {path} has non-string keys {bad}: a cached element's dict keys "
                    "must be strings; convert them in a map."
                )
            return ["d", list(x), [spec(v, f"{path}[{k!r}]") for k, v in x.items()]]
        if t is list:
            return ["l", [spec(v, f"{path}[{i}]") for i, v in enumerate(x)]]
        if t is tuple:
            return ["t", [spec(v, f"{path}[{i}]") for i, v in enumerate(x)]]
        raise _unsupported(x, path)

    structure = json.dumps(spec(element, "element"), separators=(",", ":")).encode()
    return b"".join(
        [
            _U32.pack(len(structure)),
            structure,
            _U32.pack(len(dims)),
            struct.pack(f"<{len(dims)}q", *dims),
            *buffers,
        ]
    )


def _unsupported(x: Any, path: str) -> TypeError:
    return TypeError(
        f"cache: {path} is a {type(x).__name__}, which chute cannot store without pickle: "
        "cached elements may hold dicts, lists, tuples, numpy arrays (not of objects), "
        "numbers, str, bytes and None; convert it in a map before the cache."
    )


class _Cursor:
    __slots__ = ("buf", "d", "dims", "off")

    def __init__(self, buf: bytearray, dims: list[int]) -> None:
        self.buf, self.dims, self.d, self.off = buf, dims, 0, 0


_Reader = Callable[[_Cursor], Any]
_plans: dict[bytes, _Reader] = {}


def _compile(spec: Any) -> _Reader:
    if spec == "N":
        return lambda c: None
    if spec in ("T", "F"):
        value = spec == "T"
        return lambda c: value
    if spec == "i":

        def read_int(c: _Cursor) -> int:
            c.d += 1
            return c.dims[c.d - 1]

        return read_int
    if spec == "f":

        def read_float(c: _Cursor) -> float:
            c.off += 8
            return float(_F64.unpack_from(c.buf, c.off - 8)[0])

        return read_float
    if spec in ("s", "b"):
        as_str = spec == "s"

        def read_bytes(c: _Cursor) -> Any:
            n = c.dims[c.d]
            c.d += 1
            data = bytes(c.buf[c.off : c.off + n])
            c.off += n
            return data.decode("utf-8", "surrogatepass") if as_str else data

        return read_bytes
    kind = spec[0]
    if kind == "I":
        big = int(spec[1])
        return lambda c: big
    if kind == "a":
        dt, nd = np.dtype(spec[1]), spec[2]
        item = dt.itemsize

        def read_array(c: _Cursor) -> np.ndarray:
            shape = c.dims[c.d : c.d + nd]
            c.d += nd
            count = math.prod(shape)
            if count == 0 or item == 0:
                return np.zeros(shape, dtype=dt)
            arr = np.frombuffer(c.buf, dtype=dt, count=count, offset=c.off)
            c.off += count * item
            return arr.reshape(shape)

        return read_array
    if kind == "n":
        dt = np.dtype(spec[1])

        def read_scalar(c: _Cursor) -> Any:
            c.off += dt.itemsize
            return np.frombuffer(c.buf, dtype=dt, count=1, offset=c.off - dt.itemsize)[0]

        return read_scalar
    if kind == "d":
        keys, readers = spec[1], [_compile(s) for s in spec[2]]
        pairs = list(zip(keys, readers))
        return lambda c: {k: r(c) for k, r in pairs}
    readers = [_compile(s) for s in spec[1]]
    if kind == "l":
        return lambda c: [r(c) for r in readers]
    return lambda c: tuple([r(c) for r in readers])


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The element `encode` wrote."""
    (n,) = _U32.unpack_from(data, 0)
    structure = bytes(data[4 : 4 + n])
    plan = _plans.get(structure)
    if plan is None:
        if len(_plans) > 4096:
            _plans.clear()
        plan = _plans[structure] = _compile(json.loads(structure))
    (k,) = _U32.unpack_from(data, 4 + n)
    start = 8 + n
    dims = list(struct.unpack_from(f"<{k}q", data, start)) if k else []
    return plan(_Cursor(bytearray(data[start + 8 * k :]), dims))
