"""Reductions (sum, mean, max, min over dimensions) and arg-max/arg-min."""
from __future__ import annotations

import math

from .. import dtypes as _dt
from .._native import check, lib
from ..tensor import Tensor, _empty, _wrap_dim
from .. import _trace
from .memory import convert



# ---- reductions --------------------------------------------------------------------------
def reduce_dims(x: Tensor, dim) -> list:
    """The dimensions `dim` names (None: all), wrapped and sorted, each once."""
    dims = range(x.ndim) if dim is None else (dim if isinstance(dim, (tuple, list)) else (dim,))
    out = sorted({_wrap_dim(d, x.ndim) for d in dims})
    if dim is not None and isinstance(dim, (tuple, list)) and len(out) != len(dim):
        raise ValueError(f"reduction: dimension {dim} appears more than once")
    return out


def _reduced_shape(shape: tuple, dims: list, keepdim: bool) -> tuple:
    if keepdim:
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


@_trace.traced("kernel")
def reduce(op: int, x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """sum/mean/max/min over the dimensions `dim` names, in one native pass: the reduced
    dimensions are moved last and read as one row per output, so 16-bit inputs are rounded
    once, at the end, whatever the number of dimensions. Integer sums give int64 (exact up to
    2^53, computed in float64), integer max/min keep the dtype, as in PyTorch."""
    dims = reduce_dims(x, dim)
    shape = _reduced_shape(x.shape, dims, keepdim)
    if not x.dtype.is_floating_point:
        if op == lib.IT_MEAN:
            raise TypeError(f"mean() of a {x.dtype.name} tensor is not defined; call .float() "
                            "first (as in PyTorch)")
        out = reduce(op, convert(x, _dt.float64), dim, keepdim)
        return convert(out, _dt.int64 if op == lib.IT_SUM else x.dtype)
    kept = [d for d in range(x.ndim) if d not in dims]
    outer = math.prod(x.shape[d] for d in kept)
    n = math.prod(x.shape[d] for d in dims)
    if n == 0 and op != lib.IT_SUM:
        if outer == 0:
            return _empty(shape, x.dtype, x.device)
        what = {lib.IT_MEAN: "mean", lib.IT_MAX: "max", lib.IT_MIN: "min"}[op]
        raise ValueError(f"{what}(): the reduced dimensions of shape {tuple(x.shape)} are "
                         "empty; the result would be undefined")
    out = _empty(shape, x.dtype, x.device)
    if dims and dims[-1] - dims[0] == len(dims) - 1:
        # neighbouring dimensions: read in place as [outer, n, inner], no copy
        x = x._contiguous_raw()
        outer, inner = math.prod(x.shape[:dims[0]]), math.prod(x.shape[dims[-1] + 1:])
        check(lib.it_reduce(x.device.native, op, x.dtype.native, out._ptr(), x._ptr(), outer,
                            n, inner))
        return out
    moved = x._permute_raw(kept + dims)._contiguous_raw()
    check(lib.it_reduce(x.device.native, op, x.dtype.native, out._ptr(), moved._ptr(), outer,
                        n, 1))
    return out


@_trace.traced("kernel")
def arg_extreme(x: Tensor, dim=None, keepdim: bool = False, largest: bool = True) -> Tensor:
    """argmax (largest) or argmin: int64 indices of the first extreme (NaN counts as both)."""
    fn = lib.it_argmax if largest else lib.it_argmin
    name = "argmax" if largest else "argmin"
    if not x.dtype.is_floating_point:
        x = convert(x, _dt.float64)
    if x.numel() == 0 and (dim is None or x.shape[_wrap_dim(dim, x.ndim)] == 0):
        raise ValueError(f"{name}(): the input of shape {tuple(x.shape)} is empty along the "
                         "reduced dimension")
    if dim is None:
        out = _empty((), _dt.int64, x.device)
        flat = x._contiguous_raw()
        check(fn(x.device.native, x.dtype.native, out._ptr(), flat._ptr(), 1, x.numel(), 1))
        return out._reshape_raw((1,) * x.ndim) if keepdim else out
    d = _wrap_dim(dim, x.ndim)
    x = x._contiguous_raw()
    out = _empty(x.shape[:d] + (1,) + x.shape[d + 1:], _dt.int64, x.device)
    check(fn(x.device.native, x.dtype.native, out._ptr(), x._ptr(), math.prod(x.shape[:d]),
             x.shape[d] if x.ndim else 1, math.prod(x.shape[d + 1:])))
    return out if keepdim else out._squeeze_raw(d)
