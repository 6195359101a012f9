"""Tensor factories: empty, zeros, ones, full, their _like forms, arange, linspace, logspace, eye,
rand, randn, randint, randperm (and rand_like, randn_like, randint_like), tensor, from_numpy."""
from __future__ import annotations

import math
import numbers

import numpy as np
from . import dtypes as _dt
from ._native import check, lib
from .device import CPU, as_device
from .random import default_generator
from .kernels.memory import copy_into
from .storage import Storage
from .tensor import Tensor, _empty, _parse_size


def _new(size, dtype, device, pinned: bool = False) -> Tensor:
    return _empty(_parse_size(size), _dt.as_dtype(dtype or _dt.float32), as_device(device), pinned)


def _filled(t: Tensor, value) -> Tensor:
    copy_into(t, value)
    return t


def _leaf(t: Tensor, requires_grad: bool) -> Tensor:
    """Marks a freshly filled tensor as a leaf that requires grad (after filling it)."""
    return t.requires_grad_(requires_grad) if requires_grad else t


def empty(*size, dtype=None, device=None, requires_grad: bool = False, pin_memory: bool = False) -> Tensor:
    """Uninitialised memory; pin_memory: page-locked host memory (Tensor.pin_memory())."""
    if pin_memory and as_device(device).type != "cpu":
        raise RuntimeError(f"empty(pin_memory=True): only host memory is pinned, not {as_device(device)}")
    return _leaf(_new(size, dtype, device, pin_memory), requires_grad)


def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    if not isinstance(fill_value, numbers.Number):
        raise TypeError(f"full(): fill_value must be a number, got {type(fill_value).__name__}")
    if dtype is None and isinstance(fill_value, numbers.Integral) and not isinstance(fill_value, bool):
        dtype = _dt.int64
    t = _new(size if isinstance(size, (tuple, list)) else (size,), dtype, device)
    return _leaf(_filled(t, fill_value), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _leaf(_filled(_new(size, dtype, device), 0), requires_grad)


def ones(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _leaf(_filled(_new(size, dtype, device), 1), requires_grad)


def empty_like(t: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _leaf(_empty(t.shape, _dt.as_dtype(dtype or t.dtype), as_device(device or t.device)), requires_grad)


def zeros_like(t: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _leaf(_filled(empty_like(t, dtype=dtype, device=device), 0), requires_grad)


def ones_like(t: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _leaf(_filled(empty_like(t, dtype=dtype, device=device), 1), requires_grad)


def full_like(t: Tensor, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _leaf(_filled(empty_like(t, dtype=dtype, device=device), fill_value), requires_grad)


def rand_like(t: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return rand(t.shape, dtype=dtype or t.dtype, device=device or t.device, requires_grad=requires_grad)


def randn_like(t: Tensor, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return randn(t.shape, dtype=dtype or t.dtype, device=device or t.device, requires_grad=requires_grad)


def randint_like(t: Tensor, low=0, high=None, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """randint_like(t, high) or randint_like(t, low, high): in t's shape, dtype and device."""
    if high is None:
        low, high = 0, low
    return randint(low, high, t.shape, dtype=dtype or t.dtype, device=device or t.device,
                   requires_grad=requires_grad)


def arange(start, end=None, step=1, *, dtype=None, device=None,
           requires_grad: bool = False) -> Tensor:
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange(): step must not be 0")
    n = max(0, math.ceil((end - start) / step))
    if dtype is None:
        is_int = all(isinstance(v, numbers.Integral) for v in (start, end, step))
        dtype = _dt.int64 if is_int else _dt.float32
    t = _new((n,), dtype, device)
    check(lib.it_arange(t.device.native, t.dtype.native, t._ptr(), float(start), float(step), n))
    return _leaf(t, requires_grad)


def rand(*size, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Uniform on [0, 1)."""
    return _leaf(_random(size, dtype, device, (generator or default_generator).fill_uniform),
                 requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Standard normal."""
    return _leaf(_random(size, dtype, device, (generator or default_generator).fill_normal),
                 requires_grad)


def _uniform64(n: int, generator, device) -> Tensor:
    """n float64 numbers uniform on [0, 1) with 48 random bits each (two float32 draws, whose
    24 bits alone would leave most integers of a range above 2^24 out of randint)."""
    draws = _new((2, n), _dt.float32, device)
    generator.fill_uniform(draws)
    wide = draws.to(_dt.float64)
    return wide[0] + wide[1] * 2.0 ** -24


def randint(low=0, high=None, size=None, *, generator=None, dtype=None, device=None,
            requires_grad: bool = False) -> Tensor:
    """Integers uniform on [low, high): randint(high, size) or randint(low, high, size); int64
    unless dtype says otherwise."""
    if size is None:  # randint(high, size)
        if high is None:
            raise TypeError("randint() needs high and size: randint(high, size) or randint(low, high, size)")
        low, high, size = 0, low, high
    elif high is None:  # randint(high, size=...)
        low, high = 0, low
    size = _parse_size(size if isinstance(size, (tuple, list)) else (size,))
    low, high = int(low), int(high)
    if high <= low:
        raise ValueError(f"randint(): expected low < high, got low={low}, high={high}")
    dtype = _dt.as_dtype(dtype or _dt.int64)
    if requires_grad and not dtype.is_floating_point:
        raise TypeError(f"randint(): only floating-point tensors can require gradients, not {dtype.name}")
    n = math.prod(size)
    offset = (_uniform64(n, generator or default_generator, device) * (high - low)).to(_dt.int64)
    out = (offset.clamp(max=high - low - 1) + low).to(dtype).reshape(size)
    return _leaf(out, requires_grad)


def randperm(n: int, *, generator=None, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A random permutation of 0 .. n - 1 (the order that sorts n random keys)."""
    if n < 0:
        raise ValueError(f"randperm(): n must be non-negative, got {n}")
    keys = _uniform64(n, generator or default_generator, device)
    out = keys.argsort() if n else _new((0,), _dt.int64, device)
    return _leaf(out.to(_dt.as_dtype(dtype or _dt.int64)), requires_grad)


def _from_host(values: np.ndarray, dtype, device, requires_grad: bool) -> Tensor:
    """A tensor of values computed in float64 on the host (linspace, logspace, eye)."""
    return tensor(values, dtype=_dt.as_dtype(dtype or _dt.float32), device=device, requires_grad=requires_grad)


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    if steps < 0:
        raise ValueError(f"linspace(): steps must be non-negative, got {steps}")
    # from both ends toward the middle, as PyTorch, so that end is exact
    i = np.arange(steps, dtype=np.float64)
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    values = np.where(i < steps // 2, start + i * step, end - (steps - 1 - i) * step)
    return _from_host(values, dtype, device, requires_grad)


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None, device=None,
             requires_grad: bool = False) -> Tensor:
    return _from_host(np.power(float(base), linspace(start, end, steps, dtype=_dt.float64).numpy()), dtype,
                      device, requires_grad)


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return _from_host(np.eye(n, n if m is None else m), dtype, device, requires_grad)


def _random(size, dtype, device, fill) -> Tensor:
    """The native generator draws float32/16-bit numbers; float64 tensors get float32 draws
    (the same stream as a float32 tensor of that shape) widened."""
    t = _new(size, dtype, device)
    if t.dtype is not _dt.float64:
        fill(t)
        return t
    draws = _new(size, _dt.float32, device)
    fill(draws)
    return _filled(t, draws)


def from_numpy(arr: np.ndarray) -> Tensor:
    """A CPU tensor sharing arr's memory (writes show through both ways). A read-only array is
    copied, with a warning (PyTorch warns too): kernels would otherwise write into memory numpy
    promised not to change, and writes to the tensor do not reach the array."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"from_numpy() expects a numpy.ndarray, got {type(arr).__name__}")
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "<" and np.little_endian is False):
        raise TypeError(f"from_numpy(): array has non-native byte order ({arr.dtype}); use "
                        "arr.astype(arr.dtype.newbyteorder('='))")
    dtype = _dt.from_numpy_dtype(arr.dtype)
    if not arr.flags.writeable:
        import warnings
        warnings.warn("from_numpy(): the array is read-only, so the tensor holds a copy of it (writes to "
                      "the tensor do not reach the array); pass arr.copy() to make that explicit", UserWarning,
                      stacklevel=2)
        arr = arr.copy()
    item = arr.itemsize
    if any(s < 0 or s % item for s in arr.strides):
        raise ValueError(f"from_numpy(): strides {arr.strides} are negative or not a multiple "
                         f"of the item size {item}; pass arr.copy()")
    strides = tuple(s // item for s in arr.strides)
    span = 0 if arr.size == 0 else (sum((n - 1) * s for n, s in zip(arr.shape, strides)) + 1) * item
    address = arr.__array_interface__["data"][0]
    storage = Storage.wrap(address, span, CPU, keepalive=arr)
    return Tensor._make(storage, arr.shape, strides, 0, dtype)


def tensor(data, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new tensor holding a copy of data (nested lists, numbers, numpy arrays, tensors)."""
    if isinstance(data, Tensor):
        src = data.detach()
        out = _empty(src.shape, _dt.as_dtype(dtype or src.dtype), as_device(device or src.device))
        return _leaf(_filled(out, src), requires_grad)
    arr = np.asarray(data)
    if dtype is None:
        if arr.dtype.kind == "f":
            dtype = _dt.float32 if arr.dtype not in (np.float16,) else _dt.float16
        elif arr.dtype.kind in "iu" and arr.dtype != np.uint8:
            dtype = _dt.int64
        elif arr.dtype.kind == "b":
            dtype = _dt.bool
        else:
            dtype = _dt.from_numpy_dtype(arr.dtype)
    dtype = _dt.as_dtype(dtype)
    arr = np.asarray(arr, dtype=dtype.numpy)  # (ascontiguousarray would make a 0-d array 1-d)
    out = _new(arr.shape, dtype, CPU)  # filled on the host, then moved
    out.numpy()[...] = arr
    return _leaf(out.to(as_device(device)), requires_grad)
