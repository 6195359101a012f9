"""Elementwise ops with broadcasting, reductions and matrix products."""
from __future__ import annotations

import importlib
import math
import numbers

_dt = importlib.import_module("infinitrain.dtype")  # the module; infinitrain.dtype is the class
from .._native import check, int64_array, lib
from ..tensor import Tensor, _empty, _wrap_dim
from .. import _trace
from . import _checks
from .memory import convert, copy_into


def broadcast_shapes(*shapes) -> tuple:
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        sizes = {s[i - ndim + len(s)] for s in shapes if i - ndim + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise ValueError("shapes " + " and ".join(str(tuple(s)) for s in shapes) +
                             " cannot be broadcast together")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _broadcast_strides(t: Tensor, shape: tuple) -> list:
    lead = len(shape) - t.ndim
    return [0 if i < lead or t.shape[i - lead] == 1 else t.stride(i - lead)
            for i in range(len(shape))]


def _float_if_int(t: Tensor) -> Tensor:
    return t if t.dtype.is_floating_point else convert(t, _dt.float32)


# ---- elementwise -----------------------------------------------------------------------
@_trace.traced("kernel")
def unary(op: int, x: Tensor, out: Tensor | None = None) -> Tensor:
    """op(x); out= (contiguous, x's shape and dtype; x itself is allowed) receives it."""
    _checks.floating("elementwise op", "input", x)
    x = x._contiguous_raw()
    if out is None:
        out = _empty(x.shape, x.dtype, x.device)
    else:
        _check_out(out, x.shape, x)
    check(lib.it_unary(x.device.native, op, x.dtype.native, out._ptr(), x._ptr(), x.numel()))
    return out


@_trace.traced("kernel")
def unary_backward(op: int, dout: Tensor, saved: Tensor) -> Tensor:
    """dout * f'(x); `saved` is x, or the output for exp, sqrt, tanh and sigmoid."""
    _checks.same_device("unary backward", grad=dout, saved=saved)
    _checks.same_dtype("unary backward", grad=dout, saved=saved)
    _checks.shape_is("unary backward", "grad", dout, saved.shape)
    dout, saved = dout._contiguous_raw(), saved._contiguous_raw()
    out = _empty(saved.shape, saved.dtype, saved.device)
    check(lib.it_unary_backward(saved.device.native, op, saved.dtype.native, out._ptr(),
                                dout._ptr(), saved._ptr(), saved.numel()))
    return out


def _check_out(out: Tensor, shape: tuple, like: Tensor) -> None:
    if tuple(out.shape) != tuple(shape) or out.dtype is not like.dtype or not out.is_contiguous():
        raise ValueError(f"out= must be a contiguous {like.dtype.name} tensor of shape {tuple(shape)}, "
                         f"got {out.dtype.name} {tuple(out.shape)}")


@_trace.traced("kernel")
def binary(op: int, a: Tensor, b, out: Tensor | None = None) -> Tensor:
    if not isinstance(b, Tensor):
        raise TypeError(f"expected a tensor or a number, got {type(b).__name__}")
    _checks.same_device("elementwise op", left=a, right=b)
    _checks.same_dtype("elementwise op", left=a, right=b)
    shape = broadcast_shapes(a.shape, b.shape)
    if out is None:
        out = _empty(shape, a.dtype, a.device)
    else:
        _check_out(out, shape, a)
    check(lib.it_binary(a.device.native, op, a.dtype.native, out._ptr(), a._ptr(),
                        int64_array(_broadcast_strides(a, shape)), b._ptr(),
                        int64_array(_broadcast_strides(b, shape)), int64_array(shape), len(shape)))
    return out


@_trace.traced("kernel")
def scalar(op: int, x: Tensor, s, out: Tensor | None = None) -> Tensor:
    if not isinstance(s, numbers.Real):
        raise TypeError(f"expected a number, got {type(s).__name__}")
    if not x.dtype.is_floating_point and float(s) != int(s):
        if out is not None:
            raise TypeError(f"cannot write a fractional result into a {x.dtype.name} tensor")
        x = convert(x, _dt.float32)  # int tensor with a fractional scalar: compute in float
    x = x._contiguous_raw()
    if out is None:
        out = _empty(x.shape, x.dtype, x.device)
    else:
        _check_out(out, x.shape, x)
    check(lib.it_scalar(x.device.native, op, x.dtype.native, out._ptr(), x._ptr(), float(s),
                        x.numel()))
    return out


@_trace.traced("kernel")
def add(a: Tensor, b) -> Tensor:
    return binary(lib.IT_ADD, a, b) if isinstance(b, Tensor) else scalar(lib.IT_SCALAR_ADD, a, b)


@_trace.traced("kernel")
def sub(a: Tensor, b) -> Tensor:
    return binary(lib.IT_SUB, a, b) if isinstance(b, Tensor) else scalar(lib.IT_SCALAR_ADD, a, -b)


@_trace.traced("kernel")
def rsub(a: Tensor, s) -> Tensor:
    return scalar(lib.IT_SCALAR_RSUB, a, s)


@_trace.traced("kernel")
def mul(a: Tensor, b) -> Tensor:
    return binary(lib.IT_MUL, a, b) if isinstance(b, Tensor) else scalar(lib.IT_SCALAR_MUL, a, b)


@_trace.traced("kernel")
def div(a: Tensor, b) -> Tensor:
    a = _float_if_int(a)  # true division, as in PyTorch
    if isinstance(b, Tensor):
        return binary(lib.IT_DIV, a, _float_if_int(b))
    return scalar(lib.IT_SCALAR_DIV, a, b)


@_trace.traced("kernel")
def rdiv(a: Tensor, s) -> Tensor:
    return scalar(lib.IT_SCALAR_RDIV, _float_if_int(a), s)


@_trace.traced("kernel")
def pow(a: Tensor, b) -> Tensor:  # noqa: A001
    if isinstance(b, Tensor):
        return binary(lib.IT_POW, _float_if_int(a), _float_if_int(b))
    return scalar(lib.IT_SCALAR_POW, _float_if_int(a), b)


@_trace.traced("kernel")
def swiglu(a: Tensor, b: Tensor) -> Tensor:
    """silu(a) * b."""
    _checks.same_device("swiglu", a=a, b=b)
    _checks.same_dtype("swiglu", a=a, b=b)
    _checks.shape_is("swiglu", "b", b, a.shape)
    a, b = a._contiguous_raw(), b._contiguous_raw()
    out = _empty(a.shape, a.dtype, a.device)
    check(lib.it_swiglu_forward(a.device.native, a.dtype.native, out._ptr(), a._ptr(), b._ptr(),
                                a.numel()))
    return out


@_trace.traced("kernel")
def swiglu_backward(dout: Tensor, a: Tensor, b: Tensor) -> tuple:
    _checks.same_device("swiglu backward", grad=dout, a=a, b=b)
    _checks.same_dtype("swiglu backward", grad=dout, a=a, b=b)
    _checks.shape_is("swiglu backward", "grad", dout, a.shape)
    _checks.shape_is("swiglu backward", "b", b, a.shape)
    dout, a, b = dout._contiguous_raw(), a._contiguous_raw(), b._contiguous_raw()
    da, db = _empty(a.shape, a.dtype, a.device), _empty(a.shape, a.dtype, a.device)
    check(lib.it_swiglu_backward(a.device.native, a.dtype.native, da._ptr(), db._ptr(),
                                 dout._ptr(), a._ptr(), b._ptr(), a.numel()))
    return da, db


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


# ---- matrix products -----------------------------------------------------------------
@_trace.traced("kernel")
def linear(x2d: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x2d [N, in] @ weight[out, in]^T + bias: one sgemm, the bias preloaded into the output
    and accumulated into by the product (beta = 1) instead of a separate pass."""
    _checks.same_device("linear", input=x2d, weight=weight, bias=bias)
    _checks.same_dtype("linear", input=x2d, weight=weight, bias=bias)
    _checks.floating("linear", "input", x2d)
    n, k = x2d.shape
    o = weight.shape[0]
    if weight.shape != (o, k):
        raise ValueError(f"linear: input has {k} features but weight has shape {tuple(weight.shape)} "
                         f"(expected [out_features, {k}])")
    if bias is not None and bias.shape != (o,):
        raise ValueError(f"linear: bias has shape {tuple(bias.shape)}, expected ({o},)")
    x2d, weight = x2d._contiguous_raw(), weight._contiguous_raw()
    out = _empty((n, o), x2d.dtype, x2d.device)
    if bias is not None:
        copy_into(out, bias._expand_raw((n, o)))
    check(lib.it_matmul(x2d.device.native, x2d.dtype.native, out._ptr(), x2d._ptr(), weight._ptr(),
                        1, n, o, k, 0, 1, 1.0, 1.0 if bias is not None else 0.0, 0, 0, 0))
    return out



def _as_matrices(x: Tensor, batch: tuple):
    """x expanded to batch + its last two dims, as (tensor, transposed, batch_stride) such that
    problem i starts at tensor's data + i * batch_stride, copying only when the layout needs it."""
    x = x._expand_raw(batch + x.shape[-2:])
    rows, cols = x.shape[-2:]
    s_row, s_col = x.stride()[-2:]
    if (s_col == 1 or cols == 1) and (s_row == cols or rows == 1):
        trans = False
    elif (s_row == 1 or rows == 1) and (s_col == rows or cols == 1):
        trans = True
    else:
        x, trans = x._contiguous_raw(), False
    bshape, bstrides = x.shape[:-2], x.stride()[:-2]
    live = [(n, s) for n, s in zip(bshape, bstrides) if n != 1]
    if not live or all(s == 0 for _, s in live):
        return x, trans, 0
    uniform = all(live[i][1] == live[i + 1][1] * live[i + 1][0] for i in range(len(live) - 1))
    if uniform and all(s != 0 for _, s in live):
        return x, trans, live[-1][1]
    x = x._contiguous_raw()
    return x, False, rows * cols


@_trace.traced("kernel")
def matmul(a: Tensor, b: Tensor) -> Tensor:
    if not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected a tensor, got {type(b).__name__}")
    _checks.same_device("matmul", left=a, right=b)
    _checks.same_dtype("matmul", left=a, right=b)
    _checks.floating("matmul", "left", a)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: both operands need at least one dimension")
    squeeze_rows, squeeze_cols = a.ndim == 1, b.ndim == 1
    a2 = a._unsqueeze_raw(0) if squeeze_rows else a
    b2 = b._unsqueeze_raw(-1) if squeeze_cols else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not line up "
                         f"({k} != {k2})")
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    if b2.ndim == 2 and a2.ndim > 2 and a2.is_contiguous():
        # One large product instead of a loop over the batch: fold it into the rows of a.
        out = matmul(a2._reshape_raw((a2.numel() // k if k else math.prod(a2.shape[:-1]), k)),
                     b2)._reshape_raw(batch + (m, n))
    else:
        am, ta, sa = _as_matrices(a2, batch)
        bm, tb, sb = _as_matrices(b2, batch)
        out = _empty(batch + (m, n), a.dtype, a.device)
        check(lib.it_matmul(a.device.native, a.dtype.native, out._ptr(), am._ptr(), bm._ptr(),
                            math.prod(batch), m, n, k, int(ta), int(tb), 1.0, 0.0, sa, sb, m * n))
    if squeeze_rows:
        out = out._squeeze_raw(-2)
    if squeeze_cols:
        out = out._squeeze_raw(-1)
    return out
