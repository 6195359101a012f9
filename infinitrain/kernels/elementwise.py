"""Elementwise ops with broadcasting (unary, binary, scalar, SwiGLU); reductions are in
reduce.py, matrix products in matmul.py."""
from __future__ import annotations

import numbers
from .. import dtypes as _dt
from .._native import check, int64_array, lib
from ..tensor import Tensor, _empty
from .. import _trace
from . import _checks
from .memory import convert


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
