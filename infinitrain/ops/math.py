"""Differentiable arithmetic, unary functions, matmul and softmax (the reductions: reductions.py)."""
from __future__ import annotations

import numbers

import numpy as np
from .. import dtypes as _dt
from .. import amp
from .._native import lib
from ..autograd import Function
from ..kernels import elementwise as ew
from ..kernels import matmul as kmm
from ..kernels import reduce as kred
from ..kernels import index as kidx
from ..kernels import neural as knn
from ..kernels.memory import convert
from ..tensor import Tensor, _empty


def sum_to(g: Tensor, shape: tuple) -> Tensor:
    """Sums a broadcast gradient back down to `shape`."""
    shape = tuple(shape)
    if tuple(g.shape) == shape:
        return g
    lead = g.ndim - len(shape)
    dims = list(range(lead)) + [lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1]
    out = kred.reduce(lib.IT_SUM, g, dims, keepdim=True) if dims else g
    return out._contiguous_raw()._reshape_raw(shape)


def _shape(x):
    return x.shape if isinstance(x, Tensor) else None


class Add(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, _shape(b))
        return ew.add(a, b)

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        return sum_to(g, sa), (sum_to(g, sb) if sb is not None else None)


class Sub(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.shapes = (a.shape, _shape(b))
        return ew.sub(a, b)

    @staticmethod
    def backward(ctx, g):
        sa, sb = ctx.shapes
        return sum_to(g, sa), (sum_to(-g, sb) if sb is not None else None)


class RSub(Function):  # s - a
    @staticmethod
    def forward(ctx, a, s):
        return ew.rsub(a, s)

    @staticmethod
    def backward(ctx, g):
        return -g, None


class Mul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b if isinstance(b, Tensor) else None)
        ctx.scalar = None if isinstance(b, Tensor) else b
        return ew.mul(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        if b is None:
            return ew.mul(g, ctx.scalar), None
        ga = sum_to(ew.mul(g, b), a.shape) if ctx.needs_input_grad[0] else None
        gb = sum_to(ew.mul(g, a), b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class Div(Function):
    @staticmethod
    def forward(ctx, a, b):
        out = ew.div(a, b)
        if isinstance(b, Tensor):
            ctx.save_for_backward(a, b, out)
        ctx.scalar = None if isinstance(b, Tensor) else b
        ctx.shape_a = a.shape
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.scalar is not None:
            return ew.div(g, ctx.scalar), None
        a, b, out = ctx.saved_tensors
        ga = sum_to(ew.div(g, b), a.shape) if ctx.needs_input_grad[0] else None
        gb = sum_to(-ew.div(ew.mul(g, out), b), b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class RDiv(Function):  # s / a
    @staticmethod
    def forward(ctx, a, s):
        out = ew.rdiv(a, s)
        ctx.save_for_backward(a, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, out = ctx.saved_tensors
        return -ew.div(ew.mul(g, out), a), None


class PowScalar(Function):
    @staticmethod
    def forward(ctx, a, s):
        ctx.save_for_backward(a)
        ctx.s = s
        return ew.pow(a, s)

    @staticmethod
    def backward(ctx, g):
        (a,) = ctx.saved_tensors
        return ew.mul(ew.mul(g, ew.pow(a, ctx.s - 1)), ctx.s), None


# Unary ops whose backward kernel wants the output rather than the input.
_SAVES_OUTPUT = {lib.IT_EXP, lib.IT_SQRT, lib.IT_TANH, lib.IT_SIGMOID}


class Unary(Function):
    @staticmethod
    def forward(ctx, x, op):
        out = ew.unary(op, x)
        ctx.op = op
        ctx.save_for_backward(out if op in _SAVES_OUTPUT else x)
        return out

    @staticmethod
    def backward(ctx, g):
        (saved,) = ctx.saved_tensors
        return ew.unary_backward(ctx.op, g.contiguous(), saved), None


class Clamp(Function):
    @staticmethod
    def forward(ctx, x, low, high):
        out = x
        if low is not None:
            out = ew.scalar(lib.IT_SCALAR_MAX, out, low)
        if high is not None:
            out = ew.scalar(lib.IT_SCALAR_MIN, out, high)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        x, out = ctx.saved_tensors
        # d/dx is 1 where x was not clamped (the bounds themselves included, as in PyTorch)
        inside = kidx.compare(lib.IT_EQ, out, x)
        return kidx.where(inside, g, _zeros_like(g)), None, None


class SwiGLU(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return ew.swiglu(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return ew.swiglu_backward(g, a, b)


class Maximum(Function):
    """maximum/minimum(a, b); where a == b each side gets half the gradient (PyTorch)."""

    @staticmethod
    def forward(ctx, a, b, largest):
        ctx.save_for_backward(a, b)
        ctx.largest = largest
        return ew.binary(lib.IT_MAXIMUM if largest else lib.IT_MINIMUM, a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        wins = convert(kidx.compare(lib.IT_GT if ctx.largest else lib.IT_LT, a, b), g.dtype)
        ties = convert(kidx.compare(lib.IT_EQ, a, b), g.dtype)
        share_a = ew.add(wins, ew.mul(ties, 0.5))
        ga = sum_to(ew.mul(g, share_a), a.shape) if ctx.needs_input_grad[0] else None
        gb = sum_to(ew.mul(g, ew.rsub(share_a, 1.0)), b.shape) if ctx.needs_input_grad[1] else None
        return ga, gb, None


class Pow(Function):  # tensor ** tensor
    @staticmethod
    def forward(ctx, a, b):
        out = ew.pow(a, b)
        ctx.save_for_backward(a, b, out)
        return out

    @staticmethod
    def backward(ctx, g):
        a, b, out = ctx.saved_tensors
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = sum_to(ew.mul(ew.mul(g, b), ew.pow(a, ew.scalar(lib.IT_SCALAR_ADD, b, -1.0))), a.shape)
        if ctx.needs_input_grad[1]:
            # d/db a^b = a^b log a, taken as 0 where a = 0 and b > 0 (as PyTorch)
            log_a = ew.unary(lib.IT_LOG, a)
            log_a = kidx.where(kidx.compare(lib.IT_EQ, a, _zeros((), a.dtype, a.device)),
                               _zeros((), a.dtype, a.device), log_a)
            gb = sum_to(ew.mul(ew.mul(g, out), log_a), b.shape)
        return ga, gb


class Triangle(Function):  # tril, triu
    @staticmethod
    def forward(ctx, x, diagonal, upper):
        from ..kernels.memory import triangle
        ctx.args = (diagonal, upper)
        return triangle(x, diagonal, upper)

    @staticmethod
    def backward(ctx, g):
        from ..kernels.memory import triangle
        return triangle(g, *ctx.args), None, None


def _zeros(shape, dtype, device) -> Tensor:
    from ..kernels.memory import copy_into
    out = _empty(shape, dtype, device)
    copy_into(out, 0)
    return out


def _zeros_like(t: Tensor) -> Tensor:
    return _zeros(t.shape, t.dtype, t.device)


class Matmul(Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return kmm.matmul(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        a2 = a._unsqueeze_raw(0) if a.ndim == 1 else a
        b2 = b._unsqueeze_raw(-1) if b.ndim == 1 else b
        batch = ew.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        g = g._contiguous_raw()._reshape_raw(batch + (a2.shape[-2], b2.shape[-1]))
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = sum_to(kmm.matmul(g, b2._permute_raw(_swap_last2(b2.ndim))), a2.shape)
            ga = ga._contiguous_raw()._reshape_raw(a.shape)
        if ctx.needs_input_grad[1]:
            if b2.ndim == 2 and a2.ndim > 2:  # fold the batch into one product
                k = a2.shape[-1]
                a_rows = a2._contiguous_raw()._reshape_raw((a2.numel() // k if k else 0, k))
                g_rows = g._reshape_raw((g.numel() // g.shape[-1] if g.shape[-1] else 0, g.shape[-1]))
                gb = kmm.matmul(a_rows._permute_raw((1, 0)), g_rows)
            else:
                gb = sum_to(kmm.matmul(a2._permute_raw(_swap_last2(a2.ndim)), g), b2.shape)
            gb = gb._contiguous_raw()._reshape_raw(b.shape)
        return ga, gb


def _swap_last2(ndim: int) -> tuple:
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


class Convert(Function):  # to(dtype)
    is_cast = True  # a weight cast for autocast keeps its gradient deferred with it (engine.py)

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = x.dtype
        return amp.cached_cast(x, dtype, convert)  # a parameter's autocast copy: once per region

    @staticmethod
    def backward(ctx, g):
        return (g if g.dtype is ctx.dtype else convert(g, ctx.dtype)), None


def cast(t: Tensor, dtype) -> Tensor:
    """t in dtype, recorded by autograd (t itself when it already is)."""
    return t if t.dtype is dtype else Convert.apply(t, dtype)


class Softmax(Function):
    @staticmethod
    def forward(ctx, x, dim):
        out = knn.softmax(x, dim)
        ctx.save_for_backward(out)
        ctx.dim = dim
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        return knn.softmax_backward(g, out, ctx.dim), None


# ---- entry points used by Tensor's operators ---------------------------------------------
def scalar_value(b):
    """A Python number for a number-like operand (numpy scalars and 0-d arrays included), or
    None when b is not a number."""
    if isinstance(b, (bool, np.bool_)):
        return bool(b)
    if isinstance(b, numbers.Integral):
        return int(b)
    if isinstance(b, numbers.Real):
        return float(b)
    if isinstance(b, np.ndarray) and b.ndim == 0 and b.dtype.kind in "biuf":
        return scalar_value(b[()])
    return None


def promote(a: Tensor, b):
    """Both operands in their common dtype (PyTorch's type promotion); a number stays a number."""
    if isinstance(b, Tensor):
        dt = _dt.promote_types(a.dtype, b.dtype)
        return (a if a.dtype is dt else cast(a, dt)), (b if b.dtype is dt else cast(b, dt))
    value = scalar_value(b)
    if value is None:
        raise TypeError(f"unsupported operand: a tensor and a {type(b).__name__}")
    dt = _dt.result_type_scalar(a.dtype, value)
    return (a if a.dtype is dt else cast(a, dt)), value


def _arith(a, b):
    a, b = promote(a, b)
    if a.dtype is _dt.bool:  # arithmetic on bools counts them, as integers
        a = cast(a, _dt.int64)
        b = cast(b, _dt.int64) if isinstance(b, Tensor) else b
    return a, b


def add(a, b):
    return Add.apply(*_arith(a, b))


def sub(a, b):
    return Sub.apply(*_arith(a, b))


def rsub(a, s):
    a, s = _arith(a, s)
    return RSub.apply(a, s)


def mul(a, b):
    return Mul.apply(*_arith(a, b))


def _floats(a, b):
    a, b = _arith(a, b)
    if not a.dtype.is_floating_point:  # true division and powers of integers give floats
        a = cast(a, _dt.float32)
        b = cast(b, _dt.float32) if isinstance(b, Tensor) else b
    return a, b


def div(a, b):
    return Div.apply(*_floats(a, b))


def rdiv(a, s):
    return RDiv.apply(*_floats(a, s))


def _integer_pow(a: Tensor, b) -> Tensor:
    """An integer tensor to a non-negative integer power stays an integer tensor (PyTorch's):
    computed in float64, so exactly while the result is below 2^53."""
    wide = convert(a, _dt.float64)
    out = ew.pow(wide, convert(b, _dt.float64) if isinstance(b, Tensor) else b)
    return convert(out, a.dtype)


def pow(a, b):  # noqa: A001
    if not isinstance(b, Tensor):
        a, b = _arith(a, b)
        if not a.dtype.is_floating_point and (isinstance(b, float) or b < 0):
            a = cast(a, _dt.float32)
        if not a.dtype.is_floating_point:
            return _integer_pow(a, b)
        return PowScalar.apply(a, b)
    if not a.dtype.is_floating_point and not b.dtype.is_floating_point:
        a, b = _arith(a, b)
        return _integer_pow(a, b)
    return Pow.apply(*_floats(a, b))


def rpow(a, s):  # s ** a
    if not a.dtype.is_floating_point and isinstance(scalar_value(s), int):
        base = _zeros((), _dt.int64 if a.dtype is _dt.bool else a.dtype, a.device)
        ew.scalar(lib.IT_SCALAR_ADD, base, scalar_value(s), out=base)
        return _integer_pow(base, cast(a, base.dtype))
    a, s = _floats(a, s)
    base = _zeros((), a.dtype, a.device)
    ew.scalar(lib.IT_SCALAR_ADD, base, s, out=base)
    return Pow.apply(base, a)


def maximum(a, b, largest: bool = True):
    if not isinstance(b, Tensor):
        raise TypeError(f"maximum/minimum: expected a tensor, got {type(b).__name__}")
    a, b = promote(a, b)
    return Maximum.apply(a, b, largest)


def unary(op, x):
    if not x.dtype.is_floating_point:
        x = cast(x, _dt.float32)
    return Unary.apply(x, op)


def matmul(a, b):
    if not isinstance(b, Tensor):
        raise TypeError(f"matmul: expected a tensor, got {type(b).__name__}")
    # mixed dtypes raise, as in PyTorch (outside autocast, which lowers both)
    return Matmul.apply(*amp.lower(a, b))


def softmax(x, dim=-1):
    return Softmax.apply(*amp.full(x), dim)


def clamp(x, low=None, high=None):
    if low is None and high is None:
        raise ValueError("clamp: at least one of min and max must be given")
    return Clamp.apply(x, low, high)


def swiglu(a, b):
    return SwiGLU.apply(a, b)


def triangle(x, diagonal=0, upper=False):
    return Triangle.apply(x, diagonal, upper)
