"""Tensor element types, named as in PyTorch (infinitrain.float32, infinitrain.bfloat16, ...)."""
from __future__ import annotations

import builtins

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
    if isinstance(value, builtins.bool):
        return t
    if isinstance(value, builtins.float) or (isinstance(value, np.floating)):
        return t if t.is_floating_point else float32
    return int64 if t is bool else t


def get_default_dtype() -> dtype:
    """The dtype of new floating-point tensors: float32, the one infinitrain supports."""
    return float32


def set_default_dtype(d) -> None:
    """Accepts float32 (the default already); another default is refused (PyTorch allows the
    other floating types, which infinitrain does not support as a default)."""
    d = as_dtype(d)
    if not d.is_floating_point:
        raise TypeError(f"only floating-point types are supported as the default type, got {d}")
    if d is not float32:
        raise NotImplementedError(f"set_default_dtype({d}): infinitrain's default dtype is float32 only; "
                                  "pass dtype= to the factories or call .to() instead")


class finfo:
    """Machine limits of a floating-point dtype, as torch.finfo: bits, eps, max, min, tiny
    (= smallest_normal), resolution, dtype (its name)."""

    def __init__(self, type=None):  # noqa: A002
        d = get_default_dtype() if type is None else as_dtype(type)
        if not d.is_floating_point:
            raise TypeError(f"finfo() needs a floating-point dtype, got {d}; use iinfo() for integers")
        info = ml_dtypes.finfo(d.numpy)
        self.bits = d.itemsize * 8
        self.eps, self.max, self.min = builtins.float(info.eps), builtins.float(info.max), builtins.float(info.min)
        self.tiny = self.smallest_normal = builtins.float(info.smallest_normal)
        self.resolution = 10.0 ** -info.precision
        self.dtype = d.name

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.tiny:g}, tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:
    """Limits of an integer dtype, as torch.iinfo: bits, max, min, dtype (its name)."""

    def __init__(self, type):  # noqa: A002
        d = as_dtype(type)
        if d.is_floating_point or d is bool:
            raise TypeError(f"iinfo() needs an integer dtype, got {d}; use finfo() for floating point")
        info = np.iinfo(d.numpy)
        self.bits = d.itemsize * 8
        self.max, self.min = builtins.int(info.max), builtins.int(info.min)
        self.dtype = d.name

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"

