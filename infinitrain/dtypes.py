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
float64 = dtype("float64", lib.IT_FLOAT64, np.float64, True)
bool = dtype("bool", lib.IT_BOOL, np.bool_, False)  # noqa: A001  (torch.bool)

float = float32  # noqa: A001  (torch.float)
double = float64
half = float16
int = int32  # noqa: A001
long = int64

ALL = (float32, bfloat16, float16, int32, int64, uint8, float64, bool)
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


# PyTorch's type promotion between tensors: bool < uint8 < int32 < int64 < 16-bit floats <
# float32 < float64, where float16 with bfloat16 gives float32 (neither holds the other).
_RANK = {bool: 0, uint8: 1, int32: 2, int64: 3, float16: 4, bfloat16: 4, float32: 5, float64: 6}


def promote_types(a: dtype, b: dtype) -> dtype:
    if a is b:
        return a
    if _RANK[a] == _RANK[b]:  # float16 and bfloat16
        return float32
    return a if _RANK[a] > _RANK[b] else b


def result_type_scalar(t: dtype, value) -> dtype:
    """The dtype of `tensor op python_number`: the tensor's, unless the number is of a higher
    kind (a float with an integer or bool tensor gives float32, an int with a bool gives
    int64), as PyTorch does."""
    import builtins
    if isinstance(value, builtins.bool):
        return t
    if isinstance(value, builtins.float) or (isinstance(value, np.floating)):
        return t if t.is_floating_point else float32
    return int64 if t is bool else t
