"""Tensor element types, named as in PyTorch (infinitrain.float32, infinitrain.bfloat16, ...)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ._native import lib


class dtype:
    """An element type: its native enum value, size, and the numpy dtype of its memory."""

    __slots__ = ("name", "native", "itemsize", "numpy", "is_floating_point")

    def __init__(self, name: str, native: int, numpy_dtype, is_floating_point: bool):
        self.name = name
        self.native = native
        self.numpy = np.dtype(numpy_dtype)
        self.itemsize = self.numpy.itemsize
        self.is_floating_point = is_floating_point

    def __repr__(self) -> str:
        return f"infinitrain.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


float32 = dtype("float32", lib.IT_FLOAT32, np.float32, True)
bfloat16 = dtype("bfloat16", lib.IT_BFLOAT16, ml_dtypes.bfloat16, True)
float16 = dtype("float16", lib.IT_FLOAT16, np.float16, True)
int32 = dtype("int32", lib.IT_INT32, np.int32, False)
int64 = dtype("int64", lib.IT_INT64, np.int64, False)
uint8 = dtype("uint8", lib.IT_UINT8, np.uint8, False)

float = float32  # noqa: A001  (torch.float)
half = float16
int = int32  # noqa: A001
long = int64

ALL = (float32, bfloat16, float16, int32, int64, uint8)
_BY_NUMPY = {d.numpy: d for d in ALL}
_BY_NAME = {d.name: d for d in ALL}


def _by_name(name: str) -> dtype:
    return _BY_NAME[name]


def from_numpy_dtype(np_dtype) -> dtype:
    np_dtype = np.dtype(np_dtype)
    found = _BY_NUMPY.get(np_dtype.newbyteorder("=") if np_dtype.byteorder not in "=|" else np_dtype)
    if found is None:
        supported = ", ".join(d.numpy.name for d in ALL)
        raise TypeError(f"numpy dtype {np_dtype} has no infinitrain equivalent (supported: "
                        f"{supported}); convert first, e.g. arr.astype(numpy.float32)")
    return found


def as_dtype(value) -> dtype:
    """Accepts an infinitrain dtype, its name ('bfloat16'), or a numpy dtype."""
    if isinstance(value, dtype):
        return value
    if isinstance(value, str):
        if value in _BY_NAME:
            return _BY_NAME[value]
        raise TypeError(f"unknown dtype {value!r}; expected one of {sorted(_BY_NAME)}")
    return from_numpy_dtype(value)
