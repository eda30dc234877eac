"""`ShapeDtypeStructProtocol` is checked with `isinstance`, as Grain's is."""

import numpy as np

import chute


def test_shape_dtype_struct_protocol_is_runtime_checkable() -> None:
    proto = chute.experimental.ShapeDtypeStructProtocol
    spec = chute.experimental.ShapeDtypeStruct(shape=(2,), dtype=np.int64)
    assert isinstance(spec, proto)
    assert isinstance(np.zeros(3), proto)
    assert not isinstance(3, proto)
    assert not isinstance({"shape": (2,)}, proto)
